// The run page's tags and notes: shown to everyone, editable by members (the Edit button is
// data-needs="member", so CSS hides it from viewers). Saving sends PATCH /runs/{id}; a 422
// (a tag with a space, too many tags, notes too long) stays in the form, word for word.

import { errorText, request } from "./api.js";
import { el, setText } from "./ui.js";

export class RunNotes {
  constructor(path, onSaved) {
    this.path = path;
    this.onSaved = onSaved;
    this.run = null;
    this.tags = el("ul", { class: "chips tags", id: "run-tags", "aria-label": "tags" });
    this.notes = el("p", { class: "run-notes", id: "run-notes" });
    this.tagsInput = el("input", { type: "text", id: "edit-tags", name: "tags", placeholder: "baseline resnet lr:0.1",
                                   "aria-describedby": "edit-tags-help" });
    this.notesInput = el("textarea", { id: "edit-notes", name: "notes", rows: "4", maxlength: "10000" });
    this.problem = el("p", { class: "field-error", id: "notes-error", role: "alert", hidden: true });
    this.form = el("form", { id: "notes-form", hidden: true },
      el("label", { for: "edit-tags" }, "Tags"), " ", this.tagsInput,
      el("p", { id: "edit-tags-help", class: "muted small" }, "Separated by spaces: letters, digits and _ . : / = -"),
      el("label", { for: "edit-notes" }, "Notes"), this.notesInput, this.problem,
      el("div", { class: "actions" },
        el("button", { type: "button", onclick: () => this.close() }, "Cancel"),
        el("button", { type: "submit", class: "primary", id: "save-notes" }, "Save")));
    this.form.addEventListener("submit", (event) => { event.preventDefault(); this.save(); });
    this.editButton = el("button", { type: "button", id: "edit-notes-button", "data-needs": "member",
                                     onclick: () => this.open() }, "Edit tags & notes");
    this.element = el("section", { "aria-labelledby": "notes-h", id: "run-notes-section" },
      el("h2", { id: "notes-h" }, "Tags & notes"), this.tags, this.notes, this.editButton, this.form);
  }

  render(run) {
    this.run = run;
    this.tags.replaceChildren(...(run.tags || []).map((t) => el("li", {},
      el("a", { class: "chip tag-chip", href: `#/runs?tag=${encodeURIComponent(t)}` }, t))));
    setText(this.notes, run.notes || (run.tags?.length ? "" : "No tags or notes."));
    this.notes.classList.toggle("muted", !run.notes);
  }

  open() {
    this.tagsInput.value = (this.run.tags || []).join(" ");
    this.notesInput.value = this.run.notes || "";
    this.problem.hidden = true;
    this.form.hidden = false;
    this.editButton.hidden = true;
    this.tagsInput.focus();
  }

  close() {
    this.form.hidden = true;
    this.editButton.hidden = false;
  }

  async save() {
    const tags = this.tagsInput.value.split(/[\s,]+/).filter(Boolean);
    try {
      const { data } = await request("PATCH", this.path, { body: { tags, notes: this.notesInput.value } });
      this.close();
      this.render(data);
      this.onSaved(data);
    } catch (error) {
      this.problem.textContent = `Could not save: ${errorText(error)}`;
      this.problem.hidden = false;
    }
  }
}
