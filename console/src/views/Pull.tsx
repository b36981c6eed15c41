// Pulling an image into the hub's store from the page, with its progress:
// POST /v1/images/pull streams NDJSON (`resolved` with the layers, `layer`
// progress, `layer_done`, then `done` or `error`), read as it arrives.
import { useState } from "preact/hooks";
import { ndjson } from "../api";
import { bytes, message } from "../format";

interface Layer {
  digest: string;
  size: number;
  got: number;
  done: boolean;
  cached?: boolean;
}

type PullEvent =
  | { event: "resolved"; reference: string; digest: string; layers: { digest: string; size: number }[] }
  | { event: "layer"; digest: string; downloaded: number; total: number }
  | { event: "layer_done"; digest: string; cached: boolean }
  | { event: "done"; image: { id: string; tags: string[] } }
  | { event: "error"; code: string; message: string };

export function Pull(props: { onPulled: () => void }) {
  const [reference, setReference] = useState("");
  const [tag, setTag] = useState("");
  const [busy, setBusy] = useState(false);
  const [layers, setLayers] = useState<Layer[]>([]);
  const [status, setStatus] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  const onEvent = (e: PullEvent) => {
    switch (e.event) {
      case "resolved":
        setStatus(`Resolved ${e.reference}: ${e.layers.length} layers`);
        setLayers(e.layers.map((l) => ({ digest: l.digest, size: l.size, got: 0, done: false })));
        break;
      case "layer":
        setLayers((ls) => ls.map((l) => (l.digest === e.digest ? { ...l, got: e.downloaded, size: e.total || l.size } : l)));
        break;
      case "layer_done":
        setLayers((ls) => ls.map((l) => (l.digest === e.digest ? { ...l, got: l.size, done: true, cached: e.cached } : l)));
        break;
      case "done":
        setStatus(`Pulled: ${e.image.tags.join(", ") || e.image.id}`);
        props.onPulled();
        break;
      case "error":
        setError(`${e.code}: ${e.message}`);
        break;
    }
  };

  const total = layers.reduce((n, l) => n + l.size, 0);
  const got = layers.reduce((n, l) => n + Math.min(l.got, l.size), 0);
  return (
    <section aria-labelledby="pull-title">
      <h2 id="pull-title">Pull an image</h2>
      <form
        class="row"
        aria-label="Pull an image"
        onSubmit={async (ev) => {
          ev.preventDefault();
          setBusy(true);
          setError(null);
          setStatus("Starting…");
          setLayers([]);
          try {
            const body: Record<string, string> = { reference: reference.trim() };
            if (tag.trim()) body.tag = tag.trim();
            await ndjson("/v1/images/pull", body, (line) => onEvent(line as PullEvent));
          } catch (err) {
            setError(message(err));
          } finally {
            setBusy(false);
          }
        }}
      >
        <label>
          Reference <input value={reference} placeholder="registry/repo:tag" onInput={(e) => setReference(e.currentTarget.value)} required />
        </label>
        <label>
          Store as <input value={tag} placeholder="name:tag (optional)" onInput={(e) => setTag(e.currentTarget.value)} />
        </label>
        <button type="submit" disabled={busy}>
          {busy ? "Pulling…" : "Pull"}
        </button>
      </form>
      {status && (
        <p role="status" data-testid="pull-status">
          {status}
        </p>
      )}
      {error && <p role="alert" class="error">{error}</p>}
      {layers.length > 0 && (
        <>
          <progress max={Math.max(1, total)} value={got} aria-label="Pull progress" data-testid="pull-progress" />{" "}
          <span>
            {bytes(got)} of {bytes(total)}
          </span>
          <ul>
            {layers.map((l) => (
              <li key={l.digest} class="filename" data-layer-done={String(l.done)}>
                {l.digest.slice(0, 19)} · {l.done ? (l.cached ? "cached" : "done") : `${bytes(l.got)} of ${bytes(l.size)}`}
              </li>
            ))}
          </ul>
        </>
      )}
    </section>
  );
}
