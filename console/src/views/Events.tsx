// The live event feed (GET /v1/events, Server-Sent Events read with fetch
// so the key goes as a header). Keeps the newest KEEP events.
import { useEffect, useState } from "preact/hooks";
import { sse } from "../api";
import { message } from "../format";

const KEEP = 500;

interface Event {
  id: number;
  type: string;
  time: string;
  sandbox_id?: string;
  pool?: string;
}

export function Events() {
  const [events, setEvents] = useState<Event[]>([]);
  const [types, setTypes] = useState("");
  const [sandbox, setSandbox] = useState("");
  const [applied, setApplied] = useState({ types: "", sandbox: "" });
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    const stop = new AbortController();
    setEvents([]);
    const q = new URLSearchParams({ last_event_id: "0" });
    if (applied.types) q.set("type", applied.types);
    if (applied.sandbox) q.set("sandbox", applied.sandbox);
    sse(`/v1/events?${q}`, stop.signal, (type, data) => {
      if (type === "error") {
        setError(data);
        return;
      }
      try {
        const e = JSON.parse(data) as Event;
        setEvents((list) => [e, ...list].slice(0, KEEP));
      } catch {
        /* not an event */
      }
    }).catch((e) => {
      if (!stop.signal.aborted) setError(message(e));
    });
    return () => stop.abort();
  }, [applied]);
  return (
    <section aria-labelledby="events-title">
      <h1 id="events-title">Events</h1>
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          setError(null);
          setApplied({ types: types.trim(), sandbox: sandbox.trim() });
        }}
      >
        <label>
          Types <input placeholder="created,deleted" value={types} onInput={(e) => setTypes(e.currentTarget.value)} />
        </label>
        <label>
          Sandbox <input value={sandbox} onInput={(e) => setSandbox(e.currentTarget.value)} />
        </label>
        <button type="submit">Filter</button>
      </form>
      {error && <p role="alert" class="error">{error}</p>}
      <div class="scroll">
        <table>
          <thead>
            <tr>
              <th>Time</th>
              <th>Type</th>
              <th>Sandbox</th>
              <th>Pool</th>
            </tr>
          </thead>
          <tbody>
            {events.map((e) => (
              <tr key={e.id}>
                <td>{e.time}</td>
                <td>{e.type}</td>
                <td>{e.sandbox_id ? <a href={`#/sandboxes/${encodeURIComponent(e.sandbox_id)}`}>{e.sandbox_id}</a> : "–"}</td>
                <td>{e.pool ?? "–"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}
