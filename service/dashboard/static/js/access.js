// Who is looking: GET /me gives the key's projects and roles. The header gets a project
// switcher, and <body data-role> says the key's role in the chosen project, so CSS hides the
// actions (elements marked data-needs="member") that the role may not take.

import { currentProject, getJSON, setCurrentProject } from "./api.js";

const RANK = { viewer: 0, member: 1, admin: 2 };
let me = null;

/** The key's role in the chosen project (the highest of its roles when "all" is chosen). */
export function currentRole() {
  if (!me) return null;
  const project = currentProject();
  const roles = Object.entries(me.roles);
  const matching = roles.filter(([name]) => name === "*" || !project || name === project).map(([, role]) => role);
  return matching.sort((a, b) => RANK[b] - RANK[a])[0] || null;
}

function paint(select) {
  const projects = me.projects.map((p) => p.name);
  if (currentProject() && !projects.includes(currentProject())) setCurrentProject("");
  select.replaceChildren(new Option("All projects", ""), ...projects.map((name) => new Option(name, name)));
  select.value = currentProject();
  document.body.dataset.role = currentRole() || "viewer";
}

/** Load /me and keep the switcher and the role in step; `onChange` re-renders the view. */
export async function setUpAccess(select, onChange) {
  select.addEventListener("change", () => {
    setCurrentProject(select.value);
    document.body.dataset.role = currentRole() || "viewer";
    onChange();
  });
  const load = async () => {
    me = await getJSON("/me");
    paint(select);
  };
  window.addEventListener("tessera:key", () => { load().then(onChange, () => {}); });
  await load();
}
