// The explorer's shell: tabs, the served models, the URL's hash as the state of the view shown.

import { getJSON, setApiKey } from "./api.js";
import { example, readHash, seedExample } from "./state.js";
import { h, needsText } from "./ui.js";
import translate from "./views/translate.js";
import modelView from "./views/model.js";
import interventions from "./views/interventions.js";
import lm from "./views/lm.js";
import classify from "./views/classify.js";
import caption from "./views/caption.js";
import ask from "./views/ask.js";
import rnnsearch from "./views/rnnsearch.js";
import positional from "./views/positional.js";
import listen from "./views/listen.js";

const VIEWS = [translate, modelView, interventions, lm, classify, caption, ask, listen, rnnsearch, positional];
const byId = Object.fromEntries(VIEWS.map((v) => [v.id, v]));

window.attnkit = window.attnkit || {};
const app = window.attnkit;
app.timings = app.timings || {};

function normalizeModels(body) {
  const list = Array.isArray(body) ? body : body.models || body.data || [];
  return list.map((m) => {
    const caps = m.capabilities || [];
    return { ...m, name: m.name ?? m.id, family: m.family ?? "?", capabilities: new Set(caps) };
  });
}

let models = [], current = null, currentId = null;

function tabs() {
  const nav = document.getElementById("tabs");
  nav.replaceChildren(...VIEWS.map((v) => h("a", { href: `#${v.id}`, "data-view": v.id }, v.title)));
}

// a tab whose view no served model can fill stays, dimmed, and says which model it needs
function markTabs() {
  for (const a of document.querySelectorAll("#tabs a")) {
    const { needs } = byId[a.dataset.view];
    const missing = !!needs && !models.some(needs.has);
    a.classList.toggle("unserved", missing);
    if (missing) a.title = needsText(needs);
    else a.removeAttribute("title");
  }
}

// the view a page without one in its link opens on: the first whose model is served, the Model view (any model with
// attention) only when no other is (a server of one classifier opens on Classify), else Translate
function firstServed() {
  const served = VIEWS.filter((v) => v.needs && models.some(v.needs.has));
  return (served.find((v) => v !== modelView) ?? served[0] ?? translate).id;
}

function route() {
  const { view, params } = readHash();
  const id = byId[view] ? view : firstServed();
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === id);
  if (current && currentId === id && current.restore) {  // the same view, new state (a pasted link)
    current.restore(params);
    return;
  }
  if (current && current.unmount) current.unmount();
  const root = document.getElementById("view");
  root.replaceChildren();
  root.dataset.view = id;
  const ctx = {
    models,
    modelsFor: (pred) => models.filter(pred),
    id,
  };
  currentId = id;
  app.settled = false;
  const shown = (current = byId[id].mount(root, ctx, params));
  app.view = current;
  app.viewId = id;
  // the run the view started on opening (its example), if any: settled when it is over (the tests wait on it)
  Promise.resolve(shown.first).catch(() => {}).finally(() => { if (current === shown) app.settled = true; });
}

async function start() {
  tabs();
  const statusEl = document.getElementById("server-status");
  // a server started with --api-key: ask for the key once, keep it for this tab
  setApiKey(sessionStorage.getItem("attnkit-api-key"));
  try {
    let body;
    try {
      body = await getJSON("/v1/models");
    } catch (e) {
      if (e.status !== 401) throw e;
      const key = prompt("This attnkit server needs its API key:");
      if (!key) throw e;
      sessionStorage.setItem("attnkit-api-key", key);
      setApiKey(key);
      body = await getJSON("/v1/models");
    }
    models = normalizeModels(body);
    statusEl.textContent = `${models.length} model${models.length === 1 ? "" : "s"} served`;
    statusEl.title = models.map((m) => `${m.name}: ${m.family} (${[...m.capabilities].join(", ")})`).join("\n");
  } catch (e) {
    statusEl.textContent = `server: ${e.message}`;
    statusEl.classList.add("down");
  }
  app.models = models;
  app.example = example;
  seedExample(models);
  markTabs();
  window.addEventListener("hashchange", route);
  route();
  app.ready = true;
}

start();
