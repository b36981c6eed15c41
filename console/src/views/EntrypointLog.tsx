// The entrypoint's output (GET .../entrypoint/log, the newest 64 KiB),
// shown as text. Reloaded when the sandbox changes (`stamp`) and, while
// the entrypoint runs, every few seconds.
import { useEffect, useState } from "preact/hooks";
import { raw, enc } from "../api";
import { message } from "../format";

const POLL_MS = 4000;
const TAIL = 64 << 10;

export function EntrypointLog(props: { id: string; running: boolean; stamp: number }) {
  const [text, setText] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    const load = async () => {
      try {
        const r = await raw("GET", `/v1/sandboxes/${enc(props.id)}/entrypoint/log?tail=${TAIL}`);
        const t = await r.text();
        if (live) {
          setText(t);
          setError(null);
        }
      } catch (e) {
        if (live) setError(message(e));
      }
    };
    void load();
    if (!props.running) return () => (live = false);
    const t = setInterval(load, POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [props.id, props.running, props.stamp, tick]);
  return (
    <section aria-labelledby="entrypoint-title">
      <h2 id="entrypoint-title">Entrypoint log</h2>
      <button onClick={() => setTick((n) => n + 1)}>Refresh log</button>
      {error && <p role="alert" class="error">{error}</p>}
      {text !== null && (
        <pre class="viewer" data-testid="entrypoint-log" tabIndex={0} aria-label="Entrypoint log">
          {text || "(empty)"}
        </pre>
      )}
    </section>
  );
}
