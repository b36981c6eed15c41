// Every tenant's use against its quotas, and every warm pool's fill: only
// for the operators the hub names with --admin-tenants (others get 404,
// and the console does not show this view to them).
import { useEffect, useState } from "preact/hooks";
import { call } from "../api";
import { bytes, message } from "../format";

const POLL_MS = 5000;

export interface AdminTenants {
  tenants: {
    tenant: string;
    sandboxes: number;
    sandboxes_quota?: number | null;
    memory_reserved_bytes: number;
    memory_quota_bytes?: number | null;
    snapshot_bytes: number;
    snapshot_quota_bytes?: number | null;
  }[];
  pools: { tenant: string; pool: string; target: number; ready: number; starting: number; failing: boolean }[];
}

function Against(props: { used: number; quota?: number | null; label: string; show: (n: number) => string }) {
  return (
    <span>
      {props.show(props.used)} of {props.quota == null ? "no limit" : props.show(props.quota)}
      {props.quota != null && props.quota > 0 && (
        <>
          {" "}
          <meter min={0} max={props.quota} value={props.used} high={props.quota * 0.9} aria-label={props.label} />
        </>
      )}
    </span>
  );
}

export function Operators() {
  const [data, setData] = useState<AdminTenants | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    let live = true;
    const load = () =>
      call<AdminTenants>("GET", "/v1/admin/tenants")
        .then((d) => live && (setData(d), setError(null)))
        .catch((e) => live && setError(message(e)));
    void load();
    const t = setInterval(load, POLL_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, []);
  const count = (n: number) => String(n);
  return (
    <section aria-labelledby="operators-title">
      <h1 id="operators-title">Operators</h1>
      {error && <p role="alert" class="error">{error}</p>}
      <h2>Tenants against their quotas</h2>
      <div class="scroll">
        <table>
          <thead>
            <tr>
              <th>Tenant</th>
              <th>Sandboxes</th>
              <th>Memory reserved</th>
              <th>Snapshots</th>
            </tr>
          </thead>
          <tbody>
            {(data?.tenants ?? []).map((t) => (
              <tr key={t.tenant} data-tenant={t.tenant}>
                <td>{t.tenant}</td>
                <td>
                  <Against used={t.sandboxes} quota={t.sandboxes_quota} show={count} label={`${t.tenant} sandboxes`} />
                </td>
                <td>
                  <Against used={t.memory_reserved_bytes} quota={t.memory_quota_bytes} show={bytes} label={`${t.tenant} memory`} />
                </td>
                <td>
                  <Against used={t.snapshot_bytes} quota={t.snapshot_quota_bytes} show={bytes} label={`${t.tenant} snapshots`} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <h2>Warm pools</h2>
      <div class="scroll">
        <table>
          <thead>
            <tr>
              <th>Tenant</th>
              <th>Pool</th>
              <th>Ready</th>
              <th>Starting</th>
              <th>Failing</th>
            </tr>
          </thead>
          <tbody>
            {(data?.pools ?? []).map((p) => (
              <tr key={`${p.tenant}/${p.pool}`}>
                <td>{p.tenant}</td>
                <td>{p.pool}</td>
                <td>
                  {p.ready} of {p.target}
                </td>
                <td>{p.starting}</td>
                <td>{p.failing ? "yes" : "no"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}
