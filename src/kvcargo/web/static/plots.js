// kvcargo ui: the simulator's two plots (plotly), drawn from the API's plot data. The latency CDF
// can carry a pinned run next to the current one; the link plot shows utilisation as a smoothed
// area and the queue as steps, on two axes whose ticks are round and share one grid.
"use strict";

const LATENCIES = [["ttft", "TTFT", "#3b6fd8"], ["tpot", "TPOT", "#e08a1e"], ["handoff", "hand-off", "#2f9e5a"]];
const NICE = [1, 2, 2.5, 5, 10];

// The smallest "nice" step (1, 2, 2.5 or 5 × 10^k) whose `count` multiples reach `top`.
function niceCeilStep(top, count) {
  if (!(top > 0)) return 1 / count;
  const raw = top / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of NICE) if (m * mag >= raw * (1 - 1e-12)) return m * mag;
  return 10 * mag;
}

// Centred moving average over `window` bins (fewer at the ends): each bin's value is the mean of
// the bins around it, so the curve keeps the run's level and loses the bin-to-bin noise.
function smooth(values, window) {
  const half = Math.floor(window / 2);
  const prefix = [0];
  for (const v of values) prefix.push(prefix[prefix.length - 1] + v);
  return values.map((_, i) => {
    const a = Math.max(0, i - half), b = Math.min(values.length, i + half + 1);
    return (prefix[b] - prefix[a]) / (b - a);
  });
}

function narrowPlot(div) {
  return div.clientWidth > 0 && div.clientWidth < 520;
}

function baseLayout(div) {
  const narrow = narrowPlot(div);
  return {
    margin: narrow ? { l: 48, r: 44, t: 36, b: 40 } : { l: 60, r: 60, t: 40, b: 50 },
    legend: { orientation: "h", y: narrow ? -0.3 : -0.22, font: { size: narrow ? 10 : 12 } },
    font: { size: narrow ? 11 : 12 },
  };
}

// `pinned`: null, or { label, cdf } of the run to compare with (drawn dashed).
function plotCdf(cdf, pinned) {
  const div = document.getElementById("plot-cdf");
  const traces = [];
  const curves = (data, suffix, dash) => {
    const y = data.percentiles.map((p) => p / 100);
    for (const [key, name, color] of LATENCIES) {
      if (!data[key].length) continue;
      traces.push({ x: data[key].map((s) => s * 1e3), y, name: name + suffix, mode: "lines", type: "scatter",
        line: { color, dash, width: dash === "solid" ? 2 : 1.6 } });
    }
  };
  curves(cdf, "", "solid");
  if (pinned) curves(pinned.cdf, " (pinned)", "dash");
  Plotly.react(div, traces, {
    ...baseLayout(div), title: { text: pinned ? "Latency CDF: this run vs pinned" : "Latency CDF" },
    xaxis: { title: { text: "latency (ms)" }, type: "log" },
    yaxis: { title: { text: "fraction of requests" }, range: [0, 1], dtick: 0.25 },
  }, { displaylogo: false, responsive: true });
}

// The mean of each run of `per` bins, as steps: x holds each group's start and the last end.
function coarseSteps(t, values, binS, per) {
  const x = [], y = [];
  for (let i = 0; i < values.length; i += per) {
    const part = values.slice(i, i + per);
    x.push(t[i] - binS / 2);
    y.push(part.reduce((a, b) => a + b, 0) / part.length);
  }
  x.push(t[t.length - 1] + binS / 2);
  y.push(y[y.length - 1]);
  return { x, y };
}

const seconds = (s) => `${Number(s.toPrecision(2))} s`;

function plotLink(link) {
  const div = document.getElementById("plot-link");
  const bins = Math.max(1, Math.round(link.t.length / 25));
  const busy = smooth(link.busy, bins).map((b) => 100 * b);
  const per = Math.max(1, Math.round(link.t.length / 40));
  const queue = coarseSteps(link.t, link.queue, link.bin_s, per);
  const step = niceCeilStep(Math.max(...queue.y, 0) * 1.05, 4);
  const smoothedOver = bins > 1 ? `, ${seconds(bins * link.bin_s)} average` : "";
  Plotly.react(div, [
    { x: link.t, y: busy, name: `link busy (%${smoothedOver})`, type: "scatter", mode: "lines",
      fill: "tozeroy", line: { shape: "spline", smoothing: 0.6, color: "#3b6fd8", width: 1.5 },
      fillcolor: "rgba(59, 111, 216, 0.22)" },
    { x: queue.x, y: queue.y, name: `hand-offs waiting for the link (mean per ${seconds(per * link.bin_s)})`,
      type: "scatter", mode: "lines", yaxis: "y2", line: { shape: "hv", color: "#d6333f", width: 1.4 } },
  ], {
    ...baseLayout(div), title: { text: `KV link over time (${link.channels} channel${link.channels > 1 ? "s" : ""})` },
    xaxis: { title: { text: "time (s)" } },
    yaxis: { title: { text: "busy (%)" }, range: [0, 100], dtick: 25, ticksuffix: "%" },
    yaxis2: { title: { text: "waiting (hand-offs)" }, overlaying: "y", side: "right", range: [0, 4 * step],
      dtick: step, showgrid: false, zeroline: false },
  }, { displaylogo: false, responsive: true });
}
