// Templates (JSON, edited in place; the hub's validation error is shown
// at the field it names), the local image store's images, and a pull with
// its progress.
import { useEffect, useState } from "preact/hooks";
import { ApiError, call, enc } from "../api";
import { bytes, message } from "../format";
import { Pull } from "./Pull";

interface NamedTemplate {
  name: string;
  [field: string]: unknown;
}
interface Image {
  id: string;
  tags: string[];
  layers: string[];
  size_bytes: number;
}

/** The field a hub error names: `...request: memory_mb: ...` or
 *  ``unknown field `x` ``; `null` when it names none. */
export function fieldOf(error: string): string | null {
  const at = /does not fit this request: ([^\s:]+): /.exec(error);
  if (at) return at[1];
  const unknown = /unknown field `([^`]+)`/.exec(error);
  return unknown ? unknown[1] : null;
}

function Editor(props: { name: string; initial: string; onSaved: () => void }) {
  const [text, setText] = useState(props.initial);
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState(false);
  const id = `template-${props.name}`;
  const field = error ? fieldOf(error) : null;
  return (
    <form
      onSubmit={async (e) => {
        e.preventDefault();
        setSaved(false);
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch (err) {
          setError(`not JSON: ${message(err)}`);
          return;
        }
        try {
          await call("PUT", `/v1/templates/${enc(props.name)}`, body);
          setError(null);
          setSaved(true);
          props.onSaved();
        } catch (err) {
          setError(err instanceof ApiError ? err.message : message(err));
        }
      }}
    >
      <label for={id}>Template {props.name} (JSON)</label>
      <textarea
        id={id}
        rows={12}
        class="json"
        spellcheck={false}
        value={text}
        aria-invalid={error ? "true" : undefined}
        aria-describedby={error ? `${id}-error` : undefined}
        onInput={(e) => setText(e.currentTarget.value)}
      />
      {error && (
        <p id={`${id}-error`} role="alert" class="error">
          {field && (
            <>
              Field <code data-testid="field">{field}</code>:{" "}
            </>
          )}
          {error}
        </p>
      )}
      <div class="row">
        <button type="submit">Save {props.name}</button>
        {saved && <span role="status">Saved.</span>}
      </div>
    </form>
  );
}

export function Templates() {
  const [templates, setTemplates] = useState<NamedTemplate[] | null>(null);
  const [images, setImages] = useState<Image[] | null>(null);
  const [imagesNote, setImagesNote] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [open, setOpen] = useState<string | null>(null);
  const [name, setName] = useState("");
  const [tick, setTick] = useState(0);
  useEffect(() => {
    call<{ templates: NamedTemplate[] }>("GET", "/v1/templates")
      .then((r) => setTemplates(r.templates))
      .catch((e) => setError(message(e)));
    call<{ items: Image[] }>("GET", "/v1/images")
      .then((r) => setImages(r.items))
      .catch((e) => setImagesNote(message(e)));
  }, [tick]);
  const reload = () => setTick((t) => t + 1);
  const json = (t: NamedTemplate) => {
    const { name: _, ...rest } = t;
    return JSON.stringify(rest, null, 2);
  };
  return (
    <section aria-labelledby="templates-title">
      <h1 id="templates-title">Templates</h1>
      {error && <p role="alert" class="error">{error}</p>}
      <form
        class="row"
        aria-label="New template"
        onSubmit={(e) => {
          e.preventDefault();
          setTemplates([...(templates ?? []), { name }]);
          setOpen(name);
          setName("");
        }}
      >
        <label>
          Name <input value={name} onInput={(e) => setName(e.currentTarget.value)} required />
        </label>
        <button type="submit">New template</button>
      </form>
      <ul class="cards">
        {(templates ?? []).map((t) => (
          <li key={t.name} class="card" data-template={t.name}>
            <h2>{t.name}</h2>
            {open === t.name ? (
              <Editor name={t.name} initial={json(t)} onSaved={reload} />
            ) : (
              <>
                <pre class="viewer">{json(t)}</pre>
                <button onClick={() => setOpen(t.name)}>Edit {t.name}</button>
              </>
            )}
          </li>
        ))}
      </ul>
      <Pull onPulled={reload} />
      <h2 id="images-title">Images</h2>
      {imagesNote && <p class="muted">{imagesNote}</p>}
      <div class="scroll">
        <table aria-labelledby="images-title">
          <thead>
            <tr>
              <th>Tags</th>
              <th>Id</th>
              <th>Layers</th>
              <th>Size</th>
            </tr>
          </thead>
          <tbody>
            {(images ?? []).map((i) => (
              <tr key={i.id}>
                <td>{i.tags.join(", ") || "–"}</td>
                <td class="filename">{i.id}</td>
                <td>{i.layers.length}</td>
                <td>{bytes(i.size_bytes)}</td>
              </tr>
            ))}
            {images && images.length === 0 && (
              <tr>
                <td colSpan={4} class="muted">
                  No images.
                </td>
              </tr>
            )}
          </tbody>
        </table>
      </div>
    </section>
  );
}
