// Gym environments: each live env's episode, step and running return, and
// its finished episodes' returns over time (GET /gym/v1/envs, polled).
import { lazy, Suspense } from "preact/compat";
import { useEffect, useState } from "preact/hooks";
import { call } from "../api";
import { message } from "../format";

const Rewards = lazy(() => import("./Rewards"));
const POLL_MS = 2000;

interface EnvSummary {
  env_id: string;
  episode: number;
  step: number;
  done: boolean;
  sandbox_id?: string | null;
  episode_return: number;
  episodes: { episode: number; steps: number; return: number }[];
}

export function Gym() {
  const [envs, setEnvs] = useState<EnvSummary[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    let live = true;
    const load = () =>
      call<{ envs: EnvSummary[] }>("GET", "/gym/v1/envs")
        .then((r) => live && (setEnvs(r.envs), setError(null)))
        .catch((e) => live && setError(message(e)));
    void load();
    const t = setInterval(load, POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, []);
  return (
    <section aria-labelledby="gym-title">
      <h1 id="gym-title">Gym</h1>
      {error && <p role="alert" class="error">{error}</p>}
      {envs && envs.length === 0 && <p class="muted">No live environments.</p>}
      <ul class="cards">
        {(envs ?? []).map((e) => {
          const last = e.episodes[e.episodes.length - 1];
          return (
            <li key={e.env_id} class="card" data-env={e.env_id}>
              <h2>{e.env_id}</h2>
              <p>
                Episode {e.episode}, step {e.step}
                {e.done ? " (done)" : ""} · return so far <span data-testid="running-return">{e.episode_return}</span>
              </p>
              {e.sandbox_id && (
                <p>
                  Sandbox <a href={`#/sandboxes/${encodeURIComponent(e.sandbox_id)}`}>{e.sandbox_id}</a>
                </p>
              )}
              {last && (
                <p>
                  Last finished: episode {last.episode}, {last.steps} steps, return{" "}
                  <span data-testid="last-return">{last.return}</span>
                </p>
              )}
              {e.episodes.length > 0 && (
                <Suspense fallback={<p>Loading plot…</p>}>
                  <Rewards episodes={e.episodes} />
                </Suspense>
              )}
            </li>
          );
        })}
      </ul>
    </section>
  );
}
