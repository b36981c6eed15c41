// Warm pools: fill level, last error, replicas editable.
import { lazy, Suspense } from "preact/compat";
import { useEffect, useRef, useState } from "preact/hooks";
import { call, enc, type Pool } from "../api";
import { message } from "../format";
import { useCoalesced, useLive } from "../live";

const PoolFill = lazy(() => import("./PoolFill"));
/** Without the event stream, pools are polled this often. */
const POLL_MS = 2000;
/** With it, a slow poll only adds points to the fill plots. */
const SLOW_POLL_MS = 10_000;
/** Points of fill history kept per pool. */
const HISTORY = 300;

interface Fill {
  t: number[];
  ready: number[];
}

function Replicas(props: { pool: Pool; onSaved: () => void; onError: (e: string) => void }) {
  const [n, setN] = useState(String(props.pool.replicas));
  const id = `replicas-${props.pool.name}`;
  return (
    <form
      class="row"
      onSubmit={async (e) => {
        e.preventDefault();
        try {
          await call("PUT", `/v1/pools/${enc(props.pool.name)}`, { template: props.pool.template, replicas: Number(n) });
          props.onSaved();
        } catch (err) {
          props.onError(message(err));
        }
      }}
    >
      <label for={id}>Replicas</label>
      <input id={id} type="number" min="0" value={n} onInput={(e) => setN(e.currentTarget.value)} />
      <button type="submit">Set</button>
    </form>
  );
}

export function Pools() {
  const [pools, setPools] = useState<Pool[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  const [name, setName] = useState("");
  const [template, setTemplate] = useState("default");
  // Fill history per pool, as this page saw it (kept across reloads of the list).
  const history = useRef(new Map<string, Fill>());
  const refresh = useCoalesced(() => setTick((t) => t + 1));
  // A pool member's lifecycle (created, ready, claimed, deleted) and the
  // pool's own events carry its name.
  const mode = useLive((e) => {
    if (e.pool) refresh();
  });
  useEffect(() => {
    let live = true;
    const load = () =>
      call<{ pools: Pool[] }>("GET", "/v1/pools")
        .then((r) => {
          if (!live) return;
          const now = Date.now() / 1000;
          for (const p of r.pools) {
            const h = history.current.get(p.name) ?? { t: [], ready: [] };
            h.t = [...h.t, now].slice(-HISTORY);
            h.ready = [...h.ready, p.ready].slice(-HISTORY);
            history.current.set(p.name, h);
          }
          setPools(r.pools);
        })
        .catch((e) => live && setError(message(e)));
    void load();
    const t = setInterval(load, mode === "live" ? SLOW_POLL_MS : POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [tick, mode]);
  const reload = () => setTick((t) => t + 1);
  return (
    <section aria-labelledby="pools-title">
      <h1 id="pools-title">Pools</h1>
      <form
        class="row"
        aria-label="Create a pool"
        onSubmit={async (e) => {
          e.preventDefault();
          try {
            await call("PUT", `/v1/pools/${enc(name)}`, { template, replicas: 1 });
            setName("");
            reload();
          } catch (err) {
            setError(message(err));
          }
        }}
      >
        <label>
          Name <input value={name} onInput={(e) => setName(e.currentTarget.value)} required />
        </label>
        <label>
          Template <input value={template} onInput={(e) => setTemplate(e.currentTarget.value)} required />
        </label>
        <button type="submit">Create pool</button>
      </form>
      {error && <p role="alert" class="error">{error}</p>}
      <ul class="cards">
        {(pools ?? []).map((p) => (
          <li key={p.name} class="card" data-pool={p.name}>
            <h2>{p.name}</h2>
            <p>
              Template {p.template} · <span data-testid="fill">{p.ready} ready of {p.replicas}</span> ({p.total} total)
            </p>
            <meter min={0} max={Math.max(1, p.replicas)} value={p.ready} aria-label={`${p.name} fill level`} />
            {p.last_error && <p class="error">Last error: {p.last_error}</p>}
            {(history.current.get(p.name)?.t.length ?? 0) > 1 && (
              <Suspense fallback={<p>Loading plot…</p>}>
                <PoolFill {...history.current.get(p.name)!} replicas={p.replicas} />
              </Suspense>
            )}
            <Replicas pool={p} onSaved={reload} onError={setError} />
            <button
              onClick={async () => {
                try {
                  await call("DELETE", `/v1/pools/${enc(p.name)}`);
                  reload();
                } catch (err) {
                  setError(message(err));
                }
              }}
            >
              Delete pool
            </button>
          </li>
        ))}
        {pools && pools.length === 0 && <li class="muted">No pools.</li>}
      </ul>
    </section>
  );
}
