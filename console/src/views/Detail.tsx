// One sandbox: its state, entrypoint and its log, lifecycle buttons, usage
// plots, processes, files, ports, snapshots and a terminal. The plot and the terminal are
// loaded only when shown, to keep the first load small.
import { lazy, Suspense } from "preact/compat";
import { useEffect, useState } from "preact/hooks";
import { call, enc, type Metrics, type Sandbox, type Snapshot } from "../api";
import { age, bytes, message } from "../format";
import { useCoalesced, useLive } from "../live";
import { Files } from "./Files";
import { Processes } from "./Processes";
import { EntrypointLog } from "./EntrypointLog";
import { keptShell } from "./shell";

const Usage = lazy(() => import("./Usage"));
const Terminal = lazy(() => import("./Terminal"));

/** Without the event stream, the sandbox is polled this often. */
const POLL_MS = 2000;
/** With it, its record is reloaded on its events and, to be safe, slowly. */
const SLOW_POLL_MS = 15_000;
/** Usage samples are not events: the plots keep a poll of their own. */
const METRICS_POLL_MS = 4000;

function Lifecycle(props: { sandbox: Sandbox; onDone: (note: string) => void }) {
  const id = enc(props.sandbox.id);
  const [busy, setBusy] = useState<string | null>(null);
  const act = async (label: string, method: string, path: string, body?: unknown) => {
    setBusy(label);
    try {
      const r = await call<{ id?: string } | undefined>(method, path, body);
      if (label === "Delete") location.hash = "#/sandboxes";
      else if (label === "Fork" && r?.id) location.hash = `#/sandboxes/${enc(r.id)}`;
      props.onDone(`${label}: done`);
    } catch (e) {
      props.onDone(`${label}: ${message(e)}`);
    } finally {
      setBusy(null);
    }
  };
  const button = (label: string, method: string, path: string, body?: unknown) => (
    <button disabled={busy !== null} onClick={() => void act(label, method, path, body)}>
      {busy === label ? `${label}…` : label}
    </button>
  );
  // Paused: frozen in place; Suspended: stopped, files kept. Either resumes.
  const asleep = props.sandbox.state === "Suspended" || props.sandbox.state === "Paused";
  return (
    <div class="row" role="group" aria-label="Lifecycle">
      {button("Snapshot", "POST", `/v1/sandboxes/${id}/snapshots`)}
      {button("Reset", "POST", `/v1/sandboxes/${id}/reset`, {})}
      {button("Fork", "POST", `/v1/sandboxes/${id}/fork`, {})}
      {asleep && button("Resume", "POST", `/v1/sandboxes/${id}/resume`)}
      {!asleep && button("Pause", "POST", `/v1/sandboxes/${id}/pause`)}
      {!asleep && button("Suspend", "POST", `/v1/sandboxes/${id}/suspend`)}
      {button("Delete", "DELETE", `/v1/sandboxes/${id}`)}
    </div>
  );
}

function Ports(props: { id: string }) {
  const [ports, setPorts] = useState<{ port: number; address: string }[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const load = async () => {
    try {
      setPorts((await call<{ ports: { port: number; address: string }[] }>("GET", `/v1/sandboxes/${enc(props.id)}/ports`)).ports);
      setError(null);
    } catch (e) {
      setError(message(e));
    }
  };
  useEffect(() => {
    void load();
  }, [props.id]);
  return (
    <section aria-labelledby="ports-title">
      <h2 id="ports-title">Ports</h2>
      <button onClick={() => void load()}>Refresh ports</button>
      {error && <p role="alert" class="error">{error}</p>}
      <ul>
        {(ports ?? []).map((p) => (
          <li key={p.port}>
            {p.port} ({p.address}){" "}
            <button
              onClick={async () => {
                try {
                  // A signed link: it opens the port without the API key.
                  const r = await call<{ url: string }>("POST", `/v1/sandboxes/${enc(props.id)}/port-urls/${p.port}`, {});
                  window.open(r.url, "_blank", "noopener,noreferrer");
                } catch (e) {
                  setError(message(e));
                }
              }}
            >
              Open {p.port}
            </button>
          </li>
        ))}
        {ports && ports.length === 0 && <li class="muted">No port is listening.</li>}
      </ul>
    </section>
  );
}

function Snapshots(props: { id: string; stamp: number }) {
  const [list, setList] = useState<Snapshot[]>([]);
  useEffect(() => {
    call<{ snapshots: Snapshot[] }>("GET", `/v1/sandboxes/${enc(props.id)}/snapshots`)
      .then((r) => setList(r.snapshots))
      .catch(() => setList([]));
  }, [props.id, props.stamp]);
  return (
    <section aria-labelledby="snapshots-title">
      <h2 id="snapshots-title">Snapshots</h2>
      <ul>
        {list.map((s) => (
          <li key={s.id}>
            {s.id} · {s.created_at} · {bytes(s.size_bytes)}
          </li>
        ))}
        {list.length === 0 && <li class="muted">None.</li>}
      </ul>
    </section>
  );
}

export function Detail(props: { id: string }) {
  const [sandbox, setSandbox] = useState<Sandbox | null>(null);
  const [metrics, setMetrics] = useState<Metrics | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [note, setNote] = useState<string | null>(null);
  const [stamp, setStamp] = useState(0);
  // A shell this tab kept open (a reload): re-attach to it at once.
  const [terminal, setTerminal] = useState(() => keptShell(props.id) !== null);
  const [tick, setTick] = useState(0);
  const refresh = useCoalesced(() => setTick((n) => n + 1));
  const mode = useLive((e) => {
    if (e.sandbox_id === props.id) refresh();
  });
  useEffect(() => {
    let live = true;
    const load = async () => {
      try {
        const s = await call<Sandbox>("GET", `/v1/sandboxes/${enc(props.id)}`);
        if (!live) return;
        setSandbox(s);
        setError(null);
      } catch (e) {
        if (live) setError(message(e));
      }
    };
    void load();
    const t = setInterval(load, mode === "live" ? SLOW_POLL_MS : POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [props.id, stamp, tick, mode]);
  useEffect(() => {
    let live = true;
    const load = async () => {
      const m = await call<Metrics>("GET", `/v1/sandboxes/${enc(props.id)}/metrics`).catch(() => null);
      if (live) setMetrics(m);
    };
    void load();
    const t = setInterval(load, mode === "live" ? METRICS_POLL_MS : POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [props.id, mode]);

  if (!sandbox) return error ? <p role="alert" class="error">{error}</p> : <p>Loading…</p>;
  const entry = sandbox.entrypoint;
  return (
    <section aria-labelledby="detail-title">
      <p>
        <a href="#/sandboxes">← Sandboxes</a>
      </p>
      <h1 id="detail-title">{sandbox.id}</h1>
      <dl class="facts">
        <dt>State</dt>
        <dd data-testid="state">{sandbox.state}</dd>
        <dt>Template</dt>
        <dd>{sandbox.template}</dd>
        <dt>Age</dt>
        <dd>{age(sandbox.created_at)}</dd>
        <dt>Labels</dt>
        <dd class="labels">
          {Object.entries(sandbox.labels).map(([k, v]) => (
            <span class="chip" key={k}>
              {k}={v}
            </span>
          ))}
        </dd>
        {entry && (
          <>
            <dt>Entrypoint</dt>
            <dd data-testid="entrypoint-state">
              {entry.state}
              {entry.exit_code !== null && entry.exit_code !== undefined && ` (exit ${entry.exit_code})`}
              {entry.signal !== null && entry.signal !== undefined && ` (signal ${entry.signal})`}
              {entry.message && ` · ${entry.message}`}
            </dd>
          </>
        )}
      </dl>
      <Lifecycle
        sandbox={sandbox}
        onDone={(n) => {
          setNote(n);
          setStamp((s) => s + 1);
        }}
      />
      {note && <p role="status">{note}</p>}
      <section aria-labelledby="usage-title">
        <h2 id="usage-title">Usage</h2>
        {metrics && metrics.samples.length > 0 ? (
          <Suspense fallback={<p>Loading plots…</p>}>
            <Usage metrics={metrics} />
          </Suspense>
        ) : (
          <p class="muted">No samples yet.</p>
        )}
      </section>
      {entry && <EntrypointLog id={sandbox.id} running={entry.state === "Running"} stamp={stamp + tick} />}
      <Processes id={sandbox.id} />
      <section aria-labelledby="terminal-title">
        <h2 id="terminal-title">Terminal</h2>
        {terminal ? (
          <Suspense fallback={<p>Loading terminal…</p>}>
            <Terminal id={sandbox.id} />
          </Suspense>
        ) : (
          <button onClick={() => setTerminal(true)}>Open terminal</button>
        )}
      </section>
      <Files id={sandbox.id} stamp={stamp} />
      <Ports id={sandbox.id} />
      <Snapshots id={sandbox.id} stamp={stamp} />
    </section>
  );
}
