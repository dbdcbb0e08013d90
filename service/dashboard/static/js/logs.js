// A log pane: one attempt's log, read by byte offset from `${path}/logs`: a run's worker
// stdout/stderr (GET /runs/{id}/logs, the run page) or a sweep driver's log (GET
// /sweeps/{id}/logs, the sweep page). While the attempt is live each poll fetches only the new
// bytes; once it has ended the pane stops asking. A FAILED run's traceback is at the end of its log.
// After a resume (attempt > 1) a selector reads an earlier attempt's log (`?attempt=N`): the
// traceback of the attempt that failed; "newest" follows each new attempt as it starts.

import { errorText, getJSON } from "./api.js";
import { el, setText } from "./ui.js";

// Terminal escape sequences (colours, bold): ESC [ parameters, then a letter.
const TERMINAL_CODES = /\x1b\[[0-9;?]*[A-Za-z]/g;

const MAX_PAGES_PER_POLL = 4; // a long backlog arrives over a few polls, not one huge render
const NEWEST = ""; // the selector's value that follows the newest attempt

export class LogPane {
  constructor(path, id = "run-log") {
    this.path = path;
    this.attempt = null; // the attempt shown
    this.chosen = null; // the attempt the reader picked; null: the newest
    this.record = null;
    this.offset = 0;
    this.done = false;
    this.reading = Promise.resolve(); // reads one at a time: a poll and a change of attempt never interleave
    this.text = el("pre", { class: "log mono", id, tabindex: "0", "aria-live": "off" });
    this.note = el("p", { class: "muted", id: `${id}-note` }, "Loading…");
    this.select = el("select", { id: `${id}-attempt`, onchange: () => this.choose(this.select.value) });
    this.picker = el("p", { class: "log-attempt", hidden: true },
      el("label", { for: `${id}-attempt` }, "Log of "), this.select);
    this.element = el("div", { class: "log-pane" }, this.picker, this.note, this.text);
  }

  /** Fetch what is new for the chosen attempt of ``record`` (a run or a sweep), by default its
   * newest (the pane starts again when a new attempt began). */
  poll(record) {
    this.record = record;
    const read = this.reading.then(() => this.read(record));
    this.reading = read.catch(() => {}); // the caller hears of a failure; the next read goes ahead
    return read;
  }

  async read(record) {
    this.renderPicker(record.attempt);
    const attempt = this.chosen ?? record.attempt;
    if (this.attempt !== attempt) {
      this.attempt = attempt;
      this.offset = 0;
      this.done = false;
      this.text.textContent = "";
      setText(this.note, "Loading…");
    }
    if (this.done) return;
    for (let page = 0; page < MAX_PAGES_PER_POLL; page += 1) {
      const answer = await getJSON(`${this.path}/logs?attempt=${this.attempt}&after=${this.offset}`);
      this.append(answer.text);
      this.offset = answer.next_offset;
      this.describe(answer);
      if (answer.next_offset >= answer.size) {
        this.done = !answer.live;
        return;
      }
    }
  }

  /** One option per attempt, newest first; shown once there is more than one. */
  renderPicker(attempts) {
    this.picker.hidden = attempts < 2;
    if (Number(this.select.dataset.attempts) === attempts) return;
    this.select.dataset.attempts = String(attempts);
    const options = [new Option(`attempt ${attempts} (newest)`, NEWEST)];
    for (let n = attempts - 1; n >= 1; n -= 1) options.push(new Option(`attempt ${n}`, String(n)));
    this.select.replaceChildren(...options);
    this.select.value = this.chosen === null || this.chosen === attempts ? NEWEST : String(this.chosen);
  }

  /** The reader picked an attempt: read it now (not at the page's next poll, slow for an ended run). */
  choose(value) {
    this.chosen = value === NEWEST ? null : Number(value);
    if (!this.record) return;
    this.poll(this.record).catch((error) => setText(this.note, `Could not read the log: ${errorText(error)}`));
  }

  /** No log here to read (a sweep whose driver runs outside Tessera): say where it is instead. */
  elsewhere(note) {
    this.done = true;
    this.text.hidden = true;
    this.note.textContent = note;
  }

  append(text) {
    text = text?.replace(TERMINAL_CODES, ""); // colour codes Ray's lines carry: read as text here
    if (!text) return;
    const pinned = this.text.scrollTop + this.text.clientHeight >= this.text.scrollHeight - 4;
    this.text.append(document.createTextNode(text));
    if (pinned) this.text.scrollTop = this.text.scrollHeight; // follow unless the reader scrolled up
  }

  describe(answer) {
    const where = answer.live ? "following the live attempt" : answer.source === "none" ? "no log yet" : "ended";
    this.note.textContent = `Attempt ${answer.attempt} of ${answer.attempts} · ${answer.size} bytes · ${where}`;
  }
}
