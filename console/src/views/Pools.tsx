// Warm pools: fill level, last error, replicas editable.
import { useEffect, useState } from "preact/hooks";
import { call, enc, type Pool } from "../api";
import { message } from "../format";

const POLL_MS = 2000;

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
  useEffect(() => {
    let live = true;
    const load = () =>
      call<{ pools: Pool[] }>("GET", "/v1/pools")
        .then((r) => live && setPools(r.pools))
        .catch((e) => live && setError(message(e)));
    void load();
    const t = setInterval(load, POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, [tick]);
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
