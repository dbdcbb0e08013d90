// "Are you sure?" for an action that cannot be undone (cancel a run or a sweep, delete one): a
// modal <dialog> that says what will happen, with "keep" focused first and the action next to
// it, so Escape or Enter at once changes nothing and Tab, Enter confirms. Closing it with the
// action runs `onConfirm`; a refusal goes to `onError` (the dialog has closed by then).

import { errorText } from "./api.js";
import { el, setText } from "./ui.js";

/**
 * `{dialog, open(message), close()}`: append `dialog` to the page, call `open` from the button.
 * `id` is the dialog's id (its title is `${id}-title`), `confirmId` the action button's.
 */
export function confirmDialog({ id, title, keep, confirm, confirmId, onConfirm, onError }) {
  const message = el("p", { id: `${id}-message` });
  const dialog = el("dialog", { id, "aria-labelledby": `${id}-title`, "aria-describedby": `${id}-message` },
    el("h2", { id: `${id}-title` }, title), message,
    el("form", { method: "dialog", class: "actions" },
      el("button", { value: "keep", autofocus: true }, keep),
      el("button", { value: "confirm", class: "danger", id: confirmId }, confirm)));
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "confirm") return;
    try {
      await onConfirm();
    } catch (error) {
      onError(errorText(error));
    }
  });
  return {
    dialog,
    open(text) {
      setText(message, text);
      dialog.returnValue = ""; // Escape leaves the last answer: never let it repeat a confirm
      dialog.showModal();
    },
    close() { if (dialog.open) dialog.close(); },
  };
}
