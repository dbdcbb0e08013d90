// A log pane: one attempt's log, read by byte offset from `${path}/logs`: a run's worker
// stdout/stderr (GET /runs/{id}/logs, the run page) or a sweep driver's log (GET
// /sweeps/{id}/logs, the sweep page). While the attempt is live each poll fetches only the new
// bytes; once it has ended the pane stops asking. A FAILED run's traceback is at the end of its log.

import { getJSON } from "./api.js";
import { el } from "./ui.js";

const MAX_PAGES_PER_POLL = 4; // a long backlog arrives over a few polls, not one huge render

export class LogPane {
  constructor(path, id = "run-log") {
    this.path = path;
    this.attempt = null;
    this.offset = 0;
    this.done = false;
    this.text = el("pre", { class: "log mono", id, tabindex: "0", "aria-live": "off" });
    this.note = el("p", { class: "muted", id: `${id}-note` }, "Loading…");
    this.element = el("div", { class: "log-pane" }, this.note, this.text);
  }

  /** Fetch what is new for the newest attempt of ``record`` (a run or a sweep; the pane
   * starts again when a new attempt began). */
  async poll(record) {
    if (this.attempt !== record.attempt) {
      this.attempt = record.attempt;
      this.offset = 0;
      this.done = false;
      this.text.textContent = "";
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

  /** No log here to read (a sweep whose driver runs outside Tessera): say where it is instead. */
  elsewhere(note) {
    this.done = true;
    this.text.hidden = true;
    this.note.textContent = note;
  }

  append(text) {
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
