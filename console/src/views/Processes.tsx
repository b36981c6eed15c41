// The processes started in a sandbox through the hub (GET .../processes),
// each running one with a button that kills it (the signal route). A
// process list is not an event, so it is polled while shown.
import { useEffect, useState } from "preact/hooks";
import { call, enc } from "../api";
import { message } from "../format";

const POLL_MS = 3000;

interface Process {
  pid: number;
  argv: string[];
  kind: string;
  tag?: string;
  started_at?: string;
  running: boolean;
  exit_code?: number | null;
}

export function Processes(props: { id: string }) {
  const [list, setList] = useState<Process[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    const load = async () => {
      try {
        const r = await call<{ processes: Process[] }>("GET", `/v1/sandboxes/${enc(props.id)}/processes`);
        if (live) {
          setList(r.processes);
          setError(null);
        }
      } catch (e) {
        if (live) setError(message(e));
      }
    };
    void load();
    const t = setInterval(load, POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [props.id, tick]);
  const kill = async (p: Process) => {
    try {
      await call("POST", `/v1/sandboxes/${enc(props.id)}/processes/${p.pid}/signal`, { signal: "SIGKILL" });
    } catch (e) {
      setError(message(e));
    }
    setTick((n) => n + 1);
  };
  return (
    <section aria-labelledby="processes-title">
      <h2 id="processes-title">Processes</h2>
      {error && <p role="alert" class="error">{error}</p>}
      <div class="scroll">
        <table>
          <thead>
            <tr>
              <th>Pid</th>
              <th>Command</th>
              <th>Started by</th>
              <th>Status</th>
              <th>
                <span class="visually-hidden">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {(list ?? []).map((p) => (
              <tr key={`${p.pid}-${p.started_at ?? ""}`} data-pid={p.pid} data-running={String(p.running)}>
                <td>{p.pid}</td>
                <td class="filename">
                  {p.argv.join(" ")}
                  {p.tag && <span class="chip">{p.tag}</span>}
                </td>
                <td>{p.kind}</td>
                <td>{p.running ? "running" : p.exit_code === null || p.exit_code === undefined ? "ended" : `exited ${p.exit_code}`}</td>
                <td>
                  {p.running && (
                    <button aria-label={`Kill ${p.pid}`} onClick={() => void kill(p)}>
                      Kill
                    </button>
                  )}
                </td>
              </tr>
            ))}
            {list && list.length === 0 && (
              <tr>
                <td colSpan={5} class="muted">
                  None started through the hub.
                </td>
              </tr>
            )}
          </tbody>
        </table>
      </div>
    </section>
  );
}
