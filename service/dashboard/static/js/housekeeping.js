// Archive, unarchive and delete, on the run page and the sweep page: POST /{runs|sweeps}/{id}/archive
// and /unarchive, DELETE /{runs|sweeps}/{id} (a member's actions in the record's own project; the
// buttons are data-needs="member"). Archiving hides the record from its list until Unarchive;
// Delete asks first (./confirm.js), removes an ended record with everything it stored (a
// sweep's trials too), then the view goes back to its list. A refusal (409: still running) is
// shown next to the buttons, word for word.

import { errorText, postJSON, request } from "./api.js";
import { confirmDialog } from "./confirm.js";
import { el, formatTime, setText, TERMINAL } from "./ui.js";

const WORDS = {
  run: { list: "#/runs", listName: "runs list",
         stored: "its checkpoints, logs and exported models" },
  sweep: { list: "#/sweeps", listName: "sweeps list",
           stored: "its trial runs with their checkpoints, logs and exported models, and its driver's logs" },
};

export class Housekeeping {
  /**
   * `kind` "run" or "sweep"; `path` the record's API path; `onChanged(view)` gets the record as
   * the API answered an archive or unarchive; `onDeleted(deletion)` runs after a delete.
   */
  constructor({ kind, path, onChanged, onDeleted }) {
    this.kind = kind;
    this.path = path;
    this.words = WORDS[kind];
    this.record = null;
    this.onChanged = onChanged;
    this.problem = el("p", { class: "field-error", id: `${kind}-action-error`, role: "alert", hidden: true });
    const button = (id, label, onclick, attrs = {}) =>
      el("button", { type: "button", id, hidden: true, "data-needs": "member", onclick, ...attrs }, label);
    this.archiveButton = button(`archive-${kind}`, "Archive", () => this.setArchived(true),
      { title: `hide it from the ${this.words.listName} (Unarchive shows it again)` });
    this.unarchiveButton = button(`unarchive-${kind}`, "Unarchive", () => this.setArchived(false),
      { title: `show it in the ${this.words.listName} again` });
    this.deleteButton = button(`delete-${kind}`, "Delete…", () => this.confirm.open(this.deleteMessage()),
      { class: "danger" });
    this.confirm = confirmDialog({
      id: `delete-${kind}-dialog`, title: `Delete this ${kind}?`, keep: "Keep it", confirm: `Delete ${kind}`,
      confirmId: `confirm-delete-${kind}`,
      onConfirm: async () => onDeleted((await request("DELETE", this.path)).data),
      onError: (message) => this.showProblem(`Could not delete: ${message}`),
    });
    this.buttons = [this.archiveButton, this.unarchiveButton, this.deleteButton];
    this.dialog = this.confirm.dialog;
  }

  /** Show the buttons that apply: Archive or Unarchive; Delete once the record has ended. */
  render(record) {
    this.record = record;
    this.archiveButton.hidden = Boolean(record.archived_at);
    this.unarchiveButton.hidden = !record.archived_at;
    this.deleteButton.hidden = !TERMINAL.has(record.status);
  }

  /** The "Archived" fact, `[label, value]`, or null when the record is not archived. */
  fact(record) {
    if (!record.archived_at) return null;
    return ["Archived", el("span", {}, el("time", { datetime: record.archived_at }, formatTime(record.archived_at)),
      el("span", { class: "muted" }, " · hidden from the "),
      el("a", { href: `${this.words.list}?archived=true` }, this.words.listName))];
  }

  deleteMessage() {
    const { name, status } = this.record;
    const trials = this.kind === "sweep" ? ` (${this.record.trials.length} trial${this.record.trials.length === 1 ? "" : "s"})` : "";
    return `“${name}”${trials} is ${status}. Deleting it removes it and ${this.words.stored} from the service ` +
      "and its storage. This cannot be undone.";
  }

  async setArchived(archived) {
    const [clicked, other] = archived ? [this.archiveButton, this.unarchiveButton]
      : [this.unarchiveButton, this.archiveButton];
    this.problem.hidden = true;
    clicked.disabled = true;
    try {
      const view = await postJSON(`${this.path}/${archived ? "archive" : "unarchive"}`, undefined);
      this.onChanged(view);
      other.focus(); // the clicked button is hidden now: keep the keyboard where it was
    } catch (error) {
      this.showProblem(`Could not ${archived ? "archive" : "unarchive"}: ${errorText(error)}`);
    } finally {
      clicked.disabled = false;
    }
  }

  showProblem(text) {
    setText(this.problem, text);
    this.problem.hidden = false;
  }

  close() { this.confirm.close(); }
}
