// Usage over time (GET /v1/sandboxes/{id}/metrics): CPU, memory against
// its limit, disk against its quota, processes.
import type { Metrics } from "../api";
import { Chart } from "./Chart";

const MiB = 1024 * 1024;

export default function Usage(props: { metrics: Metrics }) {
  const s = props.metrics.samples;
  const x = s.map((p) => Date.parse(p.timestamp) / 1000);
  const l = props.metrics.limits;
  return (
    <div class="charts">
      <Chart title="CPU" unit="cores" x={x} y={s.map((p) => p.cpu_cores)} limit={l.cpu} />
      <Chart title="Memory" unit="MiB" x={x} y={s.map((p) => p.memory_bytes / MiB)} limit={l.memory_mb} />
      <Chart title="Disk" unit="MiB" x={x} y={s.map((p) => (p.disk_bytes == null ? null : p.disk_bytes / MiB))} limit={l.disk_mb} />
      <Chart title="Processes" unit="pids" x={x} y={s.map((p) => p.pids)} limit={l.pids} />
    </div>
  );
}
