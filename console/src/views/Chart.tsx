// One uPlot line chart, with an optional limit line; loaded lazily with
// the views that plot (usage, rewards), so the first load stays small.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export function Chart(props: {
  title: string;
  unit: string;
  x: number[];
  y: (number | null)[];
  limit?: number | null;
  /** The x values are Unix seconds (default) or plain numbers. */
  time?: boolean;
}) {
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
      { width, height: 160, series, legend: { show: true }, axes: [{}, { size: 64 }], scales: { x: { time: props.time ?? true } } },
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
