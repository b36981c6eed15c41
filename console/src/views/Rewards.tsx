// One environment's episode returns over episodes (uPlot, loaded lazily).
import { Chart } from "./Chart";

export default function Rewards(props: { episodes: { episode: number; return: number }[] }) {
  return (
    <Chart
      title="Return"
      unit="per episode"
      x={props.episodes.map((e) => e.episode)}
      y={props.episodes.map((e) => e.return)}
      time={false}
    />
  );
}
