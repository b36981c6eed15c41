// Every sandbox of the signed-in tenant: filter, sort, and pages of
// PAGE rows, so a list of thousands renders as fast as one of a hundred.
import { useEffect, useMemo, useState } from "preact/hooks";
import { call, type Sandbox } from "../api";
import { age, bytes, message } from "../format";
import { useCoalesced, useLive } from "../live";

const PAGE = 100;
/** Without the event stream, the list is polled this often. */
const POLL_MS = 2000;
/** With it, only the usage columns (not events) need a poll, a slow one. */
const USAGE_POLL_MS = 10_000;

type Key = "id" | "state" | "template" | "age" | "cpu" | "memory" | "disk";

const value: Record<Key, (s: Sandbox) => string | number> = {
  id: (s) => s.id,
  state: (s) => s.state,
  template: (s) => s.template,
  age: (s) => -Date.parse(s.created_at),
  cpu: (s) => s.usage?.latest.cpu_cores ?? -1,
  memory: (s) => s.usage?.latest.memory_bytes ?? -1,
  disk: (s) => s.usage?.latest.disk_bytes ?? -1,
};

export function useSandboxes(): [Sandbox[] | null, string | null, () => void, string] {
  const [list, setList] = useState<Sandbox[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  const reload = useCoalesced(() => setTick((n) => n + 1));
  // Any sandbox's lifecycle event may change the list (a new row, a state).
  const mode = useLive((e) => {
    if (e.sandbox_id) reload();
  });
  useEffect(() => {
    let live = true;
    const load = async () => {
      try {
        const r = await call<{ sandboxes: Sandbox[] }>("GET", "/v1/sandboxes");
        if (live) {
          setList(r.sandboxes);
          setError(null);
        }
      } catch (e) {
        if (live) setError(message(e));
      }
    };
    void load();
    const t = setInterval(load, mode === "live" ? USAGE_POLL_MS : POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [tick, mode]);
  return [list, error, () => setTick((n) => n + 1), mode];
}

function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const pair of text.split(",")) {
    const [k, ...v] = pair.split("=");
    if (k.trim()) labels[k.trim()] = v.join("=").trim();
  }
  return labels;
}

function Create(props: { onCreated: () => void }) {
  const [template, setTemplate] = useState("default");
  const [labels, setLabels] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  return (
    <form
      class="row"
      aria-label="Create a sandbox"
      onSubmit={async (e) => {
        e.preventDefault();
        setBusy(true);
        setError(null);
        try {
          await call("POST", "/v1/sandboxes", { template, labels: parseLabels(labels) });
          props.onCreated();
        } catch (err) {
          setError(message(err));
        } finally {
          setBusy(false);
        }
      }}
    >
      <label>
        Template <input value={template} onInput={(e) => setTemplate(e.currentTarget.value)} />
      </label>
      <label>
        Labels <input placeholder="key=value, key=value" value={labels} onInput={(e) => setLabels(e.currentTarget.value)} />
      </label>
      <button type="submit" disabled={busy}>
        {busy ? "Creating…" : "Create sandbox"}
      </button>
      {error && <span role="alert" class="error">{error}</span>}
    </form>
  );
}

export function Sandboxes() {
  const [list, error, reload, mode] = useSandboxes();
  const [filter, setFilter] = useState("");
  const [sort, setSort] = useState<{ key: Key; up: boolean }>({ key: "age", up: true });
  const [page, setPage] = useState(0);

  const rows = useMemo(() => {
    const f = filter.trim().toLowerCase();
    const shown = (list ?? []).filter(
      (s) =>
        !f ||
        s.id.includes(f) ||
        s.state.toLowerCase().includes(f) ||
        s.template.toLowerCase().includes(f) ||
        Object.entries(s.labels).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(f)),
    );
    const get = value[sort.key];
    return shown.sort((a, b) => {
      const x = get(a);
      const y = get(b);
      const c = x < y ? -1 : x > y ? 1 : 0;
      return sort.up ? c : -c;
    });
  }, [list, filter, sort]);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  const at = Math.min(page, pages - 1);
  const now = Date.now();

  const head = (key: Key, label: string) => (
    <th aria-sort={sort.key === key ? (sort.up ? "ascending" : "descending") : "none"}>
      <button class="link" onClick={() => setSort({ key, up: sort.key === key ? !sort.up : true })}>
        {label}
      </button>
    </th>
  );

  return (
    <section aria-labelledby="sandboxes-title">
      <h1 id="sandboxes-title">Sandboxes</h1>
      <Create onCreated={reload} />
      <div class="row">
        <label>
          Filter{" "}
          <input
            type="search"
            value={filter}
            onInput={(e) => {
              setFilter(e.currentTarget.value);
              setPage(0);
            }}
          />
        </label>
        <span class="muted" data-testid="count">
          {list === null ? "loading" : `${rows.length} of ${list.length}`}
        </span>
        <span class="muted" data-testid="updates" title="How this list stays current">
          {mode === "live" ? "live" : "polling every 2 s"}
        </span>
      </div>
      {error && <p role="alert" class="error">{error}</p>}
      <div class="scroll">
        <table>
          <thead>
            <tr>
              {head("id", "Id")}
              {head("state", "State")}
              {head("template", "Template")}
              <th>Labels</th>
              {head("age", "Age")}
              {head("cpu", "CPU")}
              {head("memory", "Memory")}
              {head("disk", "Disk")}
            </tr>
          </thead>
          <tbody>
            {rows.slice(at * PAGE, (at + 1) * PAGE).map((s) => (
              <tr key={s.id} data-id={s.id}>
                <td>
                  <a href={`#/sandboxes/${encodeURIComponent(s.id)}`}>{s.id}</a>
                </td>
                <td>
                  <span class={`state state-${s.state.toLowerCase()}`}>{s.state}</span>
                </td>
                <td>{s.template}</td>
                <td class="labels">
                  {Object.entries(s.labels).map(([k, v]) => (
                    <span class="chip" key={k}>
                      {k}={v}
                    </span>
                  ))}
                </td>
                <td>{age(s.created_at, now)}</td>
                <td>{s.usage ? s.usage.latest.cpu_cores.toFixed(2) : "–"}</td>
                <td>{bytes(s.usage?.latest.memory_bytes)}</td>
                <td>{bytes(s.usage?.latest.disk_bytes)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {pages > 1 && (
        <nav class="row" aria-label="Pages">
          <button disabled={at === 0} onClick={() => setPage(at - 1)}>
            Previous
          </button>
          <span>
            Page {at + 1} of {pages}
          </span>
          <button disabled={at >= pages - 1} onClick={() => setPage(at + 1)}>
            Next
          </button>
        </nav>
      )}
    </section>
  );
}
