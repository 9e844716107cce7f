import { BarController, BarElement, CategoryScale, Chart, Legend, LinearScale, Tooltip } from "chart.js";
import { useEffect, useRef } from "preact/hooks";
import type { Refusals } from "../api";
import { Failed, Page, Refused, usd, usePoll } from "../ui";

Chart.register(BarController, BarElement, CategoryScale, LinearScale, Legend, Tooltip);

type Series = {
  namespace: string;
  agent: string;
  costMicroUSD: number[];
  totalMicroUSD: number;
  runs: number;
  unpricedRuns: number;
};
type Costs = { days: string[]; series: Series[]; refused: Refusals; source: string };

// A palette that tells ten series apart (then repeats).
const COLOURS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e", "#316395"];

function CostChart({ costs }: { costs: Costs }) {
  const canvas = useRef<HTMLCanvasElement>(null);
  useEffect(() => {
    if (canvas.current === null) return;
    const chart = new Chart(canvas.current, {
      type: "bar",
      data: {
        labels: costs.days,
        datasets: costs.series.map((s, i) => ({
          label: `${s.namespace} / ${s.agent}`,
          data: s.costMicroUSD.map((micro) => micro / 1_000_000),
          backgroundColor: COLOURS[i % COLOURS.length],
          stack: "cost",
        })),
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: {
          x: { stacked: true },
          y: { stacked: true, title: { display: true, text: "USD (estimated)" } },
        },
        plugins: { legend: { position: "bottom" } },
      },
    });
    return () => chart.destroy();
  }, [costs]);
  return (
    <div class="chart">
      <canvas ref={canvas} aria-label="cost per namespace and agent, per day" role="img" />
    </div>
  );
}

export function Cost() {
  const found = usePoll<Costs>("/api/cost?days=14", 60);
  return (
    <Page title="Cost">
      {found === null ? (
        <p class="muted">Loading…</p>
      ) : !found.ok ? (
        <Failed error={found.error} status={found.status} />
      ) : (
        <>
          <p class="muted">
            Per namespace and agent, per day of the last {found.data.days.length} days, from the run archive ({found.data.source}): runs
            deleted after their time to live count too.
          </p>
          <Refused refused={found.data.refused} />
          {found.data.series.length === 0 ? <p class="muted">No runs recorded in that time.</p> : <CostChart costs={found.data} />}
          <table class="cost">
            <thead>
              <tr>
                <th>Namespace</th>
                <th>Agent</th>
                <th>Runs</th>
                <th>Cost</th>
                <th>Runs of unknown cost</th>
              </tr>
            </thead>
            <tbody>
              {found.data.series.map((s) => (
                <tr key={`${s.namespace}/${s.agent}`} data-cost={`${s.namespace}/${s.agent}`}>
                  <td>{s.namespace}</td>
                  <td>{s.agent}</td>
                  <td class="num">{s.runs}</td>
                  <td class="num">{usd(s.totalMicroUSD)}</td>
                  <td class="num" title="their model has no known price">
                    {s.unpricedRuns}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </Page>
  );
}
