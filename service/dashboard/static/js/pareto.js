// The sweep's Pareto scatter: one point per trial with a metric (x: wall time, y: the sweep's
// metric) and the frontier (SweepView.pareto, fastest first) drawn as a line. A click on a
// point opens its run; the frontier is also a list of links, for keyboards and screen readers.

import uPlot from "../vendor/uPlot.esm.js";
import { el, formatNumber, formatSeconds, setText } from "./ui.js";

const HEIGHT = 300;
const HIT_RADIUS_PX = 14;
const COMPLETED_COLOR = "#1f5fbf";
const OTHER_COLOR = "#6b7280";
export const FRONTIER_COLOR = "#c2410c";

/** [min, max] widened by 8% of the span on each side (not below `floor`, when given). */
function padded(min, max, floor = -Infinity) {
  const span = max - min || Math.abs(max) || 1;
  return [Math.max(floor, min - 0.08 * span), max + 0.08 * span];
}

export class ParetoChart {
  constructor() {
    this.plot = null;
    this.points = []; // [{x, y, trial}] sorted by x: the plot's data index is the point's index
    this.key = "";
    this.plotBox = el("div", { class: "chart-plot pareto-plot", "aria-hidden": "true" });
    this.emptyNote = el("p", { class: "muted chart-empty" }, "No trial has reported the metric yet.");
    this.readout = el("p", { class: "chart-latest small", id: "pareto-readout", "aria-live": "off" },
      "Point at a trial to see it; click to open its run.");
    this.legend = el("p", { class: "pareto-legend small" },
      el("span", { class: "key-completed", "aria-hidden": "true" }, "●"), " completed trial  ",
      el("span", { class: "key-other", "aria-hidden": "true" }, "○"), " other trial (running, stopped early, failed)  ",
      el("span", { class: "key-frontier", "aria-hidden": "true" }, "—◆—"), " Pareto frontier");
    this.notDrawn = el("p", { class: "muted small", id: "pareto-not-drawn" });
    this.list = el("ol", { class: "pareto-list", id: "pareto-list", "aria-labelledby": "pareto-list-h" });
    this.listNote = el("p", { class: "muted small" });
    this.figure = el("figure", { class: "chart pareto", id: "pareto-chart", dataset: { points: "0", frontier: "0" } },
      el("figcaption", { id: "pareto-caption" }, "Metric vs wall time"),
      this.emptyNote, this.plotBox, this.legend, this.readout, this.notDrawn);
    this.element = el("div", { class: "pareto-layout" }, this.figure,
      el("div", { class: "pareto-side" },
        el("h3", { id: "pareto-list-h" }, "Frontier, fastest first"), this.listNote, this.list));
    this._resizeObserver = new ResizeObserver(() => this._fit());
    this._resizeObserver.observe(this.figure);
  }

  /** Redraw from a SweepView (only when its trials' points or the frontier changed). */
  update(sweep) {
    const frontier = new Set(sweep.pareto);
    const drawable = sweep.trials.filter((t) => Number.isFinite(t.metric) && Number.isFinite(t.wall_time_s));
    const key = JSON.stringify([sweep.metric, sweep.pareto, sweep.best_run_id,
      drawable.map((t) => [t.run_id, t.metric, t.wall_time_s, t.status])]);
    if (key === this.key) return;
    this.key = key;

    const sorted = [...drawable].sort((a, b) => a.wall_time_s - b.wall_time_s);
    let lastX = -Infinity;
    this.points = sorted.map((trial) => {
      // uPlot's aligned data needs distinct x values; two equal wall times move apart by a hair.
      const x = trial.wall_time_s > lastX ? trial.wall_time_s : lastX + 1e-6;
      lastX = x;
      return { x, y: trial.metric, trial };
    });
    const data = [
      this.points.map((p) => p.x),
      this.points.map((p) => (p.trial.status === "COMPLETED" ? p.y : null)),
      this.points.map((p) => (p.trial.status === "COMPLETED" ? null : p.y)),
      this.points.map((p) => (frontier.has(p.trial.run_id) ? p.y : null)),
    ];
    this.figure.dataset.points = String(this.points.length);
    this.figure.dataset.frontier = String(this.points.filter((p) => frontier.has(p.trial.run_id)).length);
    this.emptyNote.hidden = this.points.length > 0;
    this.plotBox.hidden = this.points.length === 0;
    const missing = sweep.trials.length - drawable.length;
    setText(this.notDrawn, missing ? `${missing} trial${missing === 1 ? "" : "s"} without a metric yet ` +
      `(not drawn).` : "");
    setText(this.figure.querySelector("figcaption"),
      `${sweep.metric} (${sweep.mode === "max" ? "higher" : "lower"} is better) vs wall time`);

    if (this.points.length) {
      if (this.plot && this.plotMetric === sweep.metric) this.plot.setData(data);
      else this._create(sweep, data);
    }
    this._renderList(sweep);
  }

  _renderList(sweep) {
    const byId = new Map(sweep.trials.map((t) => [t.run_id, t]));
    this.list.replaceChildren(...sweep.pareto.map((runId) => {
      const trial = byId.get(runId);
      return el("li", { dataset: { runId } },
        el("a", { href: `#/runs/${encodeURIComponent(runId)}` }, trial ? trial.name : runId),
        el("span", { class: "muted" }, trial
          ? ` — ${sweep.metric} ${formatNumber(trial.metric)} in ${formatSeconds(trial.wall_time_s)}` : ""),
        runId === sweep.best_run_id ? el("span", { class: "tag" }, "best") : null);
    }));
    setText(this.listNote, sweep.pareto.length ? "" :
      "Empty until a trial completes with a metric.");
  }

  _create(sweep, data) {
    if (this.plot) this.plot.destroy();
    this.plotMetric = sweep.metric;
    const dots = (color, fill) => ({
      stroke: color, fill, width: 1.5, paths: () => null, points: { show: true, size: 9, stroke: color, fill },
    });
    this.plot = new uPlot({
      width: this._width(), height: HEIGHT,
      legend: { show: false },
      // Padded ranges: a point at an extreme would otherwise sit half outside the plot, and half out of reach.
      scales: { x: { time: false, range: (_u, min, max) => padded(min, max, 0) }, y: { range: (_u, min, max) => padded(min, max) } },
      cursor: { x: false, y: false, drag: { x: false, y: false }, points: { show: false } },
      series: [
        { label: "wall time (s)" },
        { label: "completed trials", ...dots(COMPLETED_COLOR, COMPLETED_COLOR) },
        { label: "other trials", ...dots(OTHER_COLOR, "#ffffff") },
        { label: "Pareto frontier", stroke: FRONTIER_COLOR, width: 2, spanGaps: true,
          points: { show: true, size: 11, stroke: FRONTIER_COLOR, fill: FRONTIER_COLOR } },
      ],
      axes: [
        { label: "wall time (s)", values: (_u, ticks) => ticks.map(formatNumber) },
        { label: sweep.metric, size: 64, values: (_u, ticks) => ticks.map(formatNumber) },
      ],
    }, data, this.plotBox);
    const over = this.plot.over;
    over.addEventListener("mousemove", (event) => {
      const hit = this._hit(event);
      over.style.cursor = hit ? "pointer" : "default";
      if (hit) {
        setText(this.readout, `${hit.trial.name} (${hit.trial.status}): ${sweep.metric} ` +
          `${formatNumber(hit.trial.metric)} in ${formatSeconds(hit.trial.wall_time_s)}`);
      }
    });
    over.addEventListener("click", (event) => {
      const hit = this._hit(event);
      if (hit) window.location.hash = `#/runs/${encodeURIComponent(hit.trial.run_id)}`;
    });
  }

  /** The point under the mouse (within a few pixels), or null. */
  _hit(event) {
    const u = this.plot;
    let best = null;
    let bestDistance = HIT_RADIUS_PX;
    for (const point of this.points) {
      const dx = u.valToPos(point.x, "x") - event.offsetX;
      const dy = u.valToPos(point.y, "y") - event.offsetY;
      const distance = Math.hypot(dx, dy);
      if (distance <= bestDistance) { best = point; bestDistance = distance; }
    }
    return best;
  }

  _width() {
    return Math.max(240, Math.floor(this.figure.clientWidth || 600) - 24);
  }

  _fit() {
    if (this.plot) this.plot.setSize({ width: this._width(), height: HEIGHT });
  }

  destroy() {
    this._resizeObserver.disconnect();
    if (this.plot) this.plot.destroy();
  }
}
