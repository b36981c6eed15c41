// A pool's ready members over the time this page watched it (uPlot,
// loaded lazily), against its wanted replicas.
import { Chart } from "./Chart";

export default function PoolFill(props: { t: number[]; ready: number[]; replicas: number }) {
  return <Chart title="Ready" unit="members" x={props.t} y={props.ready} limit={props.replicas} />;
}
