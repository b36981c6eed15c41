// Usage over time (GET /v1/sandboxes/{id}/metrics), drawn with uPlot:
// CPU, memory against its limit, disk against its quota, processes.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import type { Metrics } from "../api";

const MiB = 1024 * 1024;

function Chart(props: { title: string; unit: string; x: number[]; y: (number | null)[]; limit?: number | null }) {
  const el = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data: uPlot.AlignedData = props.limit
    ? [props.x, props.y, props.x.map(() => props.limit!)]
    : [props.x, props.y];
  useEffect(() => {
    if (!el.current) return;
    const width = Math.max(260, Math.min(560, el.current.clientWidth || 560));
    const series: uPlot.Series[] = [{}, { label: props.unit, stroke: "#2563eb", width: 2 }];
    if (props.limit) series.push({ label: "limit", stroke: "#dc2626", dash: [6, 4] });
    plot.current = new uPlot(
      { width, height: 160, series, legend: { show: true }, axes: [{}, { size: 64 }] },
      data,
      el.current,
    );
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
  }, [props.limit]);
  useEffect(() => {
    plot.current?.setData(data);
  });
  const last = props.y[props.y.length - 1];
  return (
    <figure class="chart" data-chart={props.title}>
      <figcaption>
        {props.title}: <span data-testid={`last-${props.title}`}>{last === null ? "–" : last.toFixed(2)}</span> {props.unit}
      </figcaption>
      <div ref={el} role="img" aria-label={`${props.title} over time`} />
    </figure>
  );
}

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
