// RNNsearch: the additive (Bahdanau) attention's alignment of one translation, drawn as the paper's figure 3:
// source words across the top, generated words down the side, white for a weight of 1, black for 0.

import { attentionJSON, axes, fetchAttention } from "../attention.js";
import { pick } from "../mat.js";
import { MatrixView } from "../matrix.js";
import { example, pickModel, setExample, writeHash } from "../state.js";
import { exampleControls, h, header, job, labeled, modelSelect, noModel, pretty, status } from "../ui.js";

const ID = "rnnsearch";
const NEEDS = { what: "RNNsearch model", family: "rnnsearch", has: (m) => m.family === "rnnsearch",
  start: "an RNNsearch checkpoint, e.g. a run of configs/multi30k_en_de_rnnsearch.toml",
  hint: "A Transformer's cross-attention is in the Translate and Model views." };

function mount(root, ctx, params) {
  const rnn = ctx.modelsFor(NEEDS.has);
  const others = ctx.modelsFor((m) => m.family !== "rnnsearch" && m.capabilities.has("attention")
    && m.capabilities.has("translate"));
  const models = [...rnn, ...others];
  const view = { id: ID };
  header(root, { title: "RNNsearch alignment", view,
    lead: "The soft alignment of an RNN encoder-decoder with additive attention (Bahdanau, Cho and Bengio, 2015, "
      + "figure 3): each row is a generated word, each column a source word, white where the weight is 1, black "
      + "where it is 0. A served Transformer, chosen as the model, shows its last-layer cross-attention, averaged "
      + "over heads, to compare." });
  if (!rnn.length) { noModel(root, NEEDS); return view; }
  // a link's sentence, else the example the views share (the last one run in any view, or the first on load)
  const st = {
    model: pickModel(models, params.model, rnn.some((m) => m.name === example.model) && example.model),
    src: params.src ?? example.src, tgt: params.tgt ?? "",
  };
  let att = null;
  const save = () => writeHash(ID, st);
  const { srcInput, tgtInput, go } = exampleControls(st, { sourceHint: "a sentence",
    targetHint: "target (empty: the model's translation)", action: "Align", run: () => run() });
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" }, h("div", { class: "controls" },
    labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
    h("span", { class: "wide" }, srcInput), h("span", { class: "wide" }, tgtInput), go), msg));
  const out = h("div", { class: "output", "data-role": "output" });
  const panel = h("div", { class: "panel", "data-role": "alignment" }, h("h3", {}, "Alignment"), out);
  root.append(panel);
  const matrix = new MatrixView(panel, { cmap: "gray", maxCell: 30 });
  const pairs = h("div", { class: "tokens", style: { marginTop: "10px" } });
  panel.append(h("h3", { style: { marginTop: "10px" } }, "Each word's strongest source word"), pairs);

  async function run() {
    st.src = srcInput.value.trim(); st.tgt = tgtInput.value.trim(); save();
    if (!st.src) { status(msg, "type a sentence first", true); return; }
    setExample({ src: st.src, model: st.model });
    status(msg, "aligning…");
    await work.run(async (signal) => {
      const body = { model: st.model, source: st.src };
      if (st.tgt) body.target = st.tgt;
      att = await fetchAttention(body, { signal });
      if (!att.cross.length) throw new Error(`${st.model} has no cross-attention`);
      const mat = pick(att.cross, att.cross.length - 1, "avg");
      const [rows, cols] = axes(att, "cross");
      matrix.set(mat, { rowLabels: rows.map(pretty), colLabels: cols.map(pretty), vmax: 1,
        title: att.raw.family === "rnnsearch" ? "additive attention" : "last layer, average of heads" });
      out.textContent = att.raw.output ?? rows.map(pretty).join(" ");
      pairs.replaceChildren(...rows.map((r, i) => {
        const row = mat.row(i);
        let best = 0;
        for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
        return h("span", { class: "tok", title: `${row[best].toFixed(3)}` }, `${pretty(r)} → ${pretty(cols[best])}`);
      }));
      status(msg, `${rows.length} target × ${cols.length} source words`);
    });
  }

  view.exportPNG = () => [{ canvas: matrix.canvas, title: `${st.src}  →  ${out.textContent}` }];
  view.exportJSON = () => ({ view: ID, model: st.model, source: st.src, target: st.tgt || null,
    output: out.textContent, attention: att ? attentionJSON(att) : null });
  view.restore = (p) => {
    if (p.src !== undefined) srcInput.value = p.src;
    if (p.tgt !== undefined) tgtInput.value = p.tgt;
    run();
  };
  view.unmount = () => work.abort();
  view.run = run;
  if (st.src) view.first = run();
  return view;
}

export default { id: ID, title: "RNNsearch", mount, needs: NEEDS };
