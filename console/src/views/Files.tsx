// The sandbox's workspace: list, open a directory, view a text file,
// download, upload (button or drag and drop). Names are the sandbox's,
// so hostile: they are only ever rendered as text and sent URL-encoded.
import { useEffect, useState } from "preact/hooks";
import { call, enc, raw, type FileEntry } from "../api";
import { bytes, message } from "../format";

/** How much of a file "View" shows. */
const VIEW_LIMIT = 256 * 1024;

function filePath(id: string, dir: string[], name?: string): string {
  const parts = name === undefined ? dir : [...dir, name];
  return `/v1/sandboxes/${enc(id)}/files/${parts.length ? parts.map(enc).join("/") : "."}`;
}

export function Files(props: { id: string; stamp: number }) {
  const [dir, setDir] = useState<string[]>([]);
  const [entries, setEntries] = useState<FileEntry[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [viewing, setViewing] = useState<{ name: string; text: string } | null>(null);
  const [over, setOver] = useState(false);
  const [tick, setTick] = useState(0);

  useEffect(() => {
    call<{ entries: FileEntry[] }>("GET", `${filePath(props.id, dir)}?type=directory`)
      .then((r) => {
        setEntries(r.entries.sort((a, b) => a.name.localeCompare(b.name)));
        setError(null);
      })
      .catch((e) => {
        setEntries([]);
        setError(message(e));
      });
  }, [props.id, dir, props.stamp, tick]);

  const upload = async (files: FileList | null) => {
    if (!files) return;
    try {
      for (const f of Array.from(files)) await raw("PUT", filePath(props.id, dir, f.name), f);
      setTick((t) => t + 1);
    } catch (e) {
      setError(message(e));
    }
  };
  const view = async (name: string) => {
    try {
      // Only the first VIEW_LIMIT bytes are read: a file of gigabytes
      // must not be pulled into the tab to show its start.
      const r = await raw("GET", filePath(props.id, dir, name));
      const reader = r.body!.getReader();
      const parts: BlobPart[] = [];
      let have = 0;
      while (have < VIEW_LIMIT) {
        const { value, done } = await reader.read();
        if (done) break;
        parts.push(value as Uint8Array<ArrayBuffer>);
        have += value.length;
      }
      await reader.cancel();
      const text = await new Blob(parts).slice(0, VIEW_LIMIT).text();
      setViewing({ name, text: have > VIEW_LIMIT ? `${text}\n… (first ${VIEW_LIMIT / 1024} KiB shown)` : text });
    } catch (e) {
      setError(message(e));
    }
  };
  const download = async (name: string) => {
    try {
      const r = await raw("GET", filePath(props.id, dir, name));
      const url = URL.createObjectURL(await r.blob());
      const a = document.createElement("a");
      a.href = url;
      a.download = name;
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      setError(message(e));
    }
  };

  return (
    <section
      aria-labelledby="files-title"
      class={over ? "drop over" : "drop"}
      onDragOver={(e) => {
        e.preventDefault();
        setOver(true);
      }}
      onDragLeave={() => setOver(false)}
      onDrop={(e) => {
        e.preventDefault();
        setOver(false);
        void upload(e.dataTransfer?.files ?? null);
      }}
    >
      <h2 id="files-title">Files</h2>
      <div class="row">
        <span data-testid="cwd">/{dir.join("/")}</span>
        {dir.length > 0 && <button onClick={() => setDir(dir.slice(0, -1))}>Up</button>}
        <label class="button">
          Upload files
          <input type="file" multiple class="visually-hidden" onChange={(e) => void upload(e.currentTarget.files)} />
        </label>
        <span class="muted">or drop files here</span>
      </div>
      {error && <p role="alert" class="error">{error}</p>}
      <div class="scroll">
        <table>
          <thead>
            <tr>
              <th>Name</th>
              <th>Size</th>
              <th>Modified</th>
              <th>Actions</th>
            </tr>
          </thead>
          <tbody>
            {(entries ?? []).map((f) => (
              <tr key={f.name}>
                <td class="filename">
                  {f.type === "directory" ? (
                    <button class="link" onClick={() => setDir([...dir, f.name])}>
                      {f.name}/
                    </button>
                  ) : (
                    f.name
                  )}
                </td>
                <td>{bytes(f.size)}</td>
                <td>{f.modified_at}</td>
                <td>
                  {f.type !== "directory" && (
                    <>
                      <button onClick={() => void view(f.name)} aria-label={`View ${f.name}`}>
                        View
                      </button>{" "}
                      <button onClick={() => void download(f.name)} aria-label={`Download ${f.name}`}>
                        Download
                      </button>
                    </>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {viewing && (
        <figure>
          <figcaption>
            {viewing.name} <button onClick={() => setViewing(null)}>Close</button>
          </figcaption>
          <pre class="viewer">{viewing.text}</pre>
        </figure>
      )}
    </section>
  );
}
