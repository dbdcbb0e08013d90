// Live metric charts: a thin wrapper over the vendored uPlot. A chart holds every point it
// was given (key -> step -> value) and redraws from that when new points arrive, so the run
// page only ever asks the API for points after its cursor.

import uPlot from "../vendor/uPlot.esm.js";
import { el, formatNumber, setText } from "./ui.js";

const LOSS = /(^|\/)loss$/;
const QUALITY = /(accuracy|perplexity)$/;

/** The run page's panels: which metric keys each one plots. Unmatched keys are not charted.
 *  `never(spec)`: why a run with this spec never reports the panel's metrics (null: it may).
 *  `untilPoints`: the panel is hidden until its first point (most runs never report its keys).
 *  `byScale`: the panel's chart holds the keys whose values all lie within [-1, 1]; each other key
 *  gets a chart of its own beside it (ScaleSplitChart). */
export const PANELS = [
  { id: "loss", title: "Loss", match: (key) => LOSS.test(key) },
  { id: "quality", title: "Accuracy / perplexity", match: (key) => QUALITY.test(key),
    never: (spec) => (spec?.data && !spec.data.eval
      ? "No eval data set: this run's spec has no data.eval, so it reports no accuracy or perplexity." : null) },
  // The spec's eval_metrics (eval/f1_macro, eval/auroc, your own), but those named *accuracy, charted above.
  { id: "eval-metrics", title: "Evaluation metrics", untilPoints: true, byScale: true,
    match: (key) => key.startsWith("eval/") && !LOSS.test(key) && !QUALITY.test(key) },
  { id: "throughput", title: "Throughput (samples/s)", match: (key) => key.startsWith("throughput/") },
  { id: "lr", title: "Learning rate", match: (key) => key === "lr" || key.startsWith("lr/") },
];

const NO_POINTS = "No points yet.";
const NO_POINTS_ENDED = "No points reported."; // an ended run sends no more: "yet" would promise some
// Eight: Compare shows up to 8 runs, each in its own colour on every chart.
export const COLORS = ["#1f5fbf", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207", "#4b5563"];
const HEIGHT = 220;

export class MetricChart {
  constructor({ id, title, untilPoints = false, xLabel = "step", colorOf = null }) {
    this.untilPoints = untilPoints;
    this.xLabel = xLabel; // what the x values are: steps, or what Compare's x-axis picker chose
    this.colorOf = colorOf; // a series' colour by its key (Compare: each run's own on every chart), else by order
    this.series = new Map(); // key -> Map(step -> value)
    this.lastStep = new Map(); // key -> largest step seen
    this.numPoints = 0;
    this.dirty = false;
    this.plot = null;
    this.plotKeys = "";
    this.plotBox = el("div", { class: "chart-plot" });
    this.emptyNote = el("p", { class: "muted chart-empty" }, NO_POINTS);
    this.latest = el("p", { class: "chart-latest small" });
    this.zoomNote = el("p", { class: "chart-zoom small" });
    this.zoomNote.hidden = true;
    this.figure = el("figure", { class: "chart", id: `chart-${id}`, dataset: { points: "0" } },
      el("figcaption", {}, title), this.emptyNote, this.plotBox, this.zoomNote, this.latest);
    this.figure.hidden = untilPoints;
    this._resizeObserver = new ResizeObserver(() => this._fit());
    this._resizeObserver.observe(this.figure);
  }

  add(key, step, value) {
    let points = this.series.get(key);
    if (!points) this.series.set(key, (points = new Map()));
    if (!points.has(step)) this.numPoints += 1;
    points.set(step, value); // a re-reported step (after a restart) replaces the old value
    if (!(this.lastStep.get(key) >= step)) this.lastStep.set(key, step);
    this.dirty = true;
  }

  /** Take series `key` off the chart; returns its points (step -> value), none if it had none. */
  remove(key) {
    const points = this.series.get(key) || new Map();
    this.series.delete(key);
    this.lastStep.delete(key);
    this.numPoints -= points.size;
    if (points.size) this.dirty = true;
    return points;
  }

  /** What the chart says while it has no points: `why` it never will, or (null) that none came
   *  (yet, unless the run has `ended`). */
  explainEmpty(why, ended = false) {
    setText(this.emptyNote, why || (ended ? NO_POINTS_ENDED : NO_POINTS));
    this.figure.dataset.never = why ? "true" : "false";
  }

  /** Redraw if points were added since the last call. */
  flush() {
    if (!this.dirty) return;
    this.dirty = false;
    const keys = [...this.series.keys()]; // first-seen order: a series keeps its colour
    const steps = [...new Set(keys.flatMap((k) => [...this.series.get(k).keys()]))].sort((a, b) => a - b);
    const data = [steps, ...keys.map((k) => {
      const points = this.series.get(k);
      return steps.map((s) => (points.has(s) ? points.get(s) : null));
    })];
    this.figure.dataset.points = String(this.numPoints);
    this.emptyNote.hidden = steps.length > 0;
    // Shown before the plot is made: it takes the figure's width.
    this.figure.hidden = this.untilPoints && !steps.length;
    const zoom = this._zoom();
    if (this.plot && this.plotKeys === keys.join(",")) {
      this.plot.setData(data, !zoom); // keep a user's zoom; double-click resets it
    } else {
      this._create(keys, data); // a new series: a new plot, on the range the user had zoomed to
      if (zoom) this.plot.setScale("x", zoom);
    }
    this.lastSteps = steps;
    this._sayZoom();
    setText(this.latest, keys.map((k) => {
      const last = this.lastStep.get(k);
      const at = Number.isInteger(last) ? String(last) : formatNumber(last); // a step whole, not 1.23e+5
      return `${k} ${formatNumber(this.series.get(k).get(last))} @ ${this.xLabel} ${at}`;
    }).join(" · "));
  }

  /** The x range the user zoomed to (dragged across the chart), or null when the chart shows
   *  every step it had at its last redraw. */
  _zoom(plot = this.plot) {
    const x = plot && plot.scales.x;
    if (!x || x.min === null || !this.lastSteps || !this.lastSteps.length) return null;
    const zoomed = x.min > this.lastSteps[0] || x.max < this.lastSteps[this.lastSteps.length - 1];
    return zoomed ? { min: x.min, max: x.max } : null;
  }

  /** Say so while the chart is zoomed, and how to see it all: uPlot's double-click is not discoverable. */
  _sayZoom(plot = this.plot) {
    const zoom = this._zoom(plot);
    this.zoomNote.hidden = !zoom;
    if (zoom) {
      // Steps whole (120000, not 1.2e+5), as the latest-value line writes them; other x-axes (Compare's) as numbers.
      const at = this.xLabel === "step" ? (x) => String(Math.round(x)) : formatNumber;
      setText(this.zoomNote, `Zoomed to ${this.xLabel} ${at(zoom.min)}–${at(zoom.max)}; ` +
        "double-click the chart to see it all.");
    }
  }

  _create(keys, data) {
    if (this.plot) this.plot.destroy();
    const perplexity = keys.some((k) => k.endsWith("perplexity"));
    const series = [{ label: this.xLabel }, ...keys.map((key, i) => {
      const sparse = key.startsWith("eval/"); // evaluated every interval: draw its points
      return {
        label: key,
        stroke: (this.colorOf && this.colorOf(key)) || COLORS[i % COLORS.length],
        width: 1.5,
        dash: sparse ? [6, 4] : undefined,
        spanGaps: true,
        points: { show: sparse, size: 6 },
        scale: key.endsWith("perplexity") ? "ppl" : "y",
        value: (_u, v) => (v === null || v === undefined ? "–" : formatNumber(v)),
      };
    })];
    const axes = [{ label: this.xLabel }, { scale: "y", size: 64, values: (_u, ticks) => ticks.map(formatNumber) }];
    if (perplexity) axes.push({ scale: "ppl", side: 1, size: 64, grid: { show: false }, label: "perplexity" });
    this.plotKeys = keys.join(",");
    this.plot = new uPlot({
      width: this._width(), height: HEIGHT,
      scales: { x: { time: false } },
      cursor: { drag: { x: true, y: false } },
      hooks: { setScale: [(u, key) => { if (key === "x") this._sayZoom(u); }] },
      series, axes,
    }, data, this.plotBox);
  }

  _width() {
    return Math.max(200, Math.floor(this.figure.clientWidth || 600) - 2);
  }

  _fit() {
    if (this.plot) this.plot.setSize({ width: this._width(), height: HEIGHT });
  }

  destroy() {
    this._resizeObserver.disconnect();
    if (this.plot) this.plot.destroy();
  }
}

/** A panel whose metrics may differ in scale: scores (eval/f1_macro 0.93, a correlation -0.2) share
 *  the panel's chart, and any key with a value outside [-1, 1] (a count such as eval/errors_per_class_3 = 40)
 *  moves, points and all, to a chart of its own that follows it in the grid, for good: on one
 *  y-axis the count would flatten the scores into a line at the bottom. A key keeps its colour
 *  wherever it is drawn. Same interface as MetricChart, for ChartGrid. */
class ScaleSplitChart {
  constructor(panel) {
    this.panel = panel;
    this.colors = new Map(); // key -> its colour, by first-seen order in the panel
    this.colorOf = (key) => this.colors.get(key);
    this.shared = new MetricChart({ ...panel, colorOf: this.colorOf });
    this.figure = this.shared.figure;
    this.own = new Map(); // key -> the chart of that key alone
  }

  add(key, step, value) {
    if (!this.colors.has(key)) this.colors.set(key, COLORS[this.colors.size % COLORS.length]);
    let chart = this.own.get(key);
    if (!chart && Math.abs(value) > 1) {
      chart = new MetricChart({ id: `${this.panel.id}-${this.own.size + 1}`, title: key, untilPoints: true,
        colorOf: this.colorOf });
      chart.figure.dataset.key = key;
      this._charts().at(-1).figure.after(chart.figure); // after the panel's last chart
      this.own.set(key, chart);
      for (const [s, v] of this.shared.remove(key)) chart.add(key, s, v);
    }
    (chart || this.shared).add(key, step, value);
  }

  explainEmpty(why, ended = false) {
    this.shared.explainEmpty(why, ended); // a chart of its own is made with its first point
  }

  flush() {
    for (const chart of this._charts()) chart.flush();
  }

  destroy() {
    for (const chart of this._charts()) chart.destroy();
  }

  _charts() {
    return [this.shared, ...this.own.values()];
  }
}

/** One chart per panel; `add(points)` routes API metric points to the panels that match. */
export class ChartGrid {
  constructor() {
    this.charts = PANELS.map((panel) => ({ panel,
      chart: panel.byScale ? new ScaleSplitChart(panel) : new MetricChart(panel) }));
    this.element = el("div", { class: "chart-grid" }, this.charts.map((c) => c.chart.figure));
  }

  /** Tell each panel the run's spec, and whether the run has ended: a panel whose metrics it
   *  never reports says why; an empty one of an ended run does not wait for points. */
  describe(spec, ended = false) {
    for (const { panel, chart } of this.charts) chart.explainEmpty(panel.never ? panel.never(spec) : null, ended);
  }

  add(points) {
    for (const point of points) {
      for (const { panel, chart } of this.charts) {
        if (panel.match(point.key)) chart.add(point.key, point.step, point.value);
      }
    }
    for (const { chart } of this.charts) chart.flush();
  }

  destroy() {
    for (const { chart } of this.charts) chart.destroy();
  }
}
