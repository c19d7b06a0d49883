// The template workshop page: list, form and YAML views, live check, preview, try, versions (no library, no CDN).
// Every check, preview and save goes to /workshop/api (backend/workshop/api.py); the page decides nothing itself.
"use strict";

const STRINGS = {
  en: {
    title: "Template workshop",
    back_to_chat: "Back to the chat",
    log_in: "Log in",
    templates: "Templates",
    new_name: "Name for a new template or a copy",
    new: "New",
    duplicate: "Copy of the open one",
    form_view: "Form",
    yaml_view: "YAML",
    yaml_help: "The file as it is kept in the prompts folder.",
    problems: "Problems",
    no_problems: "No problems: this template can be saved.",
    note_placeholder: "What changed (optional)",
    save: "Save",
    delete: "Delete",
    preview: "Preview and try",
    sample: "A message someone might send",
    preview_button: "Preview",
    try_button: "Try with the model",
    col_template: "Template",
    col_priority: "Priority",
    col_match: "Matches",
    rendered_system: "System text the model gets",
    rendered_user: "User text the model gets",
    sampling: "Sampling settings sent",
    try_draft: "This draft (not saved)",
    try_saved: "The saved version",
    versions: "Versions",
    no_versions: "No versions yet: the first save makes one.",
    diff_button: "Diff with the current file",
    restore_button: "Restore",
    unsaved: "not saved yet",
    who: "{user} ({role})",
    local: "on this machine",
    saved: "Saved as version {number}.",
    created: "Created {name}.",
    restored: "Restored version {number} (saved as version {new}).",
    deleted: "Deleted {name}; its versions are kept.",
    copied: "Copied to {name}.",
    need_name: "Type a name above first.",
    confirm_delete: "Delete {name}? Its versions are kept and it can be restored.",
    fix_yaml_first: "The YAML has a problem the form cannot show; fix it in the YAML view first.",
    outcome_draft: "With {model} answering, the chat picks this template ({reason}).",
    outcome_other_first: "This template matches ({mine}), but {picked} (priority {theirs}) comes first in the routing order, so with {model} answering the chat picks {picked} ({reason}).",
    outcome_demo_off: "This template matches ({mine}), but its route_on_demo is false and the demo model {model} answers now, so the chat picks {picked} ({reason}). Starting the message with /{name} chooses this template.",
    outcome_no_match: "This template's rules do not catch this message; with {model} answering the chat picks {picked} ({reason}). Starting the message with /{name} chooses this template.",
    outcome_no_draft: "Fix the problems to see the preview; with {model} answering the chat picks {picked} ({reason}).",
    demo_off_cell: "{reason} (off on the demo model)",
    demo_off_tag: "off on the demo model",
    route_default: "(not set: yes)",
    route_yes: "yes",
    route_no: "no",
    no_match_cell: "—",
    none: "(none)",
    streaming: "…",
    finished: "finished ({tokens} tokens)",
    failed: "Failed",
    // a number field's range, from the template schema (GET /fields)
    range_ge_le: "{ge} to {le}",
    range_gt_le: "above {gt} and at most {le}",
    field_help: {
      name: "A short name, also used as /name in the chat: lowercase letters, digits, - or _.",
      description: "What the template is for; shown in the chat's template list.",
      priority: "When several templates match, the higher number is tried first (a whole number, may be negative).",
      keywords: "Words that send a message to this template, one per line. English words match whole words only.",
      patterns: "Regular expressions that send a message here, one per line (for those who know them).",
      system: "Instructions for the model before the conversation (optional).",
      user: "The message the model receives; {input} is where the user's text goes (required).",
      variables: "Extra placeholders with default values, one `name: value` per line; use them as {name}.",
      temperature: "How varied the replies are, {range}; empty keeps the chat's setting.",
      top_p: "Choose among the most likely words up to this share, {range}; empty keeps the chat's.",
      max_tokens: "The longest reply in tokens, {range}; empty keeps the chat's setting.",
      stop: "Texts that end the reply when the model writes them, one per line.",
      route_on_demo: "Whether messages go to this template by its keywords and patterns while the offline demo model answers. /name and the settings choose it either way.",
    },
  },
  zh: {
    title: "模板工坊",
    back_to_chat: "返回聊天",
    log_in: "登录",
    templates: "模板",
    new_name: "新模板或副本的名字",
    new: "新建",
    duplicate: "复制当前模板",
    form_view: "表单",
    yaml_view: "YAML",
    yaml_help: "模板文件在 prompts 文件夹中的原样内容。",
    problems: "问题",
    no_problems: "没有问题：此模板可以保存。",
    note_placeholder: "改了什么（可选）",
    save: "保存",
    delete: "删除",
    preview: "预览与试用",
    sample: "用户可能发送的一条消息",
    preview_button: "预览",
    try_button: "用模型试一试",
    col_template: "模板",
    col_priority: "优先级",
    col_match: "匹配",
    rendered_system: "模型收到的系统提示",
    rendered_user: "模型收到的用户消息",
    sampling: "发送的采样设置",
    try_draft: "此草稿（未保存）",
    try_saved: "已保存的版本",
    versions: "版本",
    no_versions: "还没有版本：第一次保存时会生成。",
    diff_button: "与当前文件比较",
    restore_button: "恢复",
    unsaved: "尚未保存",
    who: "{user}（{role}）",
    local: "本机",
    saved: "已保存为第 {number} 版。",
    created: "已创建 {name}。",
    restored: "已恢复第 {number} 版（保存为第 {new} 版）。",
    deleted: "已删除 {name}；它的各个版本仍保留。",
    copied: "已复制为 {name}。",
    need_name: "请先在上方输入名字。",
    confirm_delete: "删除 {name}？它的各个版本会保留，之后可以恢复。",
    fix_yaml_first: "YAML 中有表单无法显示的问题；请先在 YAML 视图中修正。",
    outcome_draft: "现在由 {model} 回答，聊天会选用此模板（{reason}）。",
    outcome_other_first: "此模板匹配（{mine}），但 {picked}（优先级 {theirs}）在路由顺序中排在前面，所以现在由 {model} 回答时聊天会选用 {picked}（{reason}）。",
    outcome_demo_off: "此模板匹配（{mine}），但它的 route_on_demo 为 false，而现在由演示模型 {model} 回答，所以聊天会选用 {picked}（{reason}）。在消息开头写 /{name} 可以选用此模板。",
    outcome_no_match: "此模板的规则不匹配这条消息；现在由 {model} 回答，聊天会选用 {picked}（{reason}）。在消息开头写 /{name} 可以选用此模板。",
    outcome_no_draft: "请先修正问题再查看预览；现在由 {model} 回答，聊天会选用 {picked}（{reason}）。",
    demo_off_cell: "{reason}（在演示模型上不启用）",
    demo_off_tag: "在演示模型上不启用",
    route_default: "（未设置：是）",
    route_yes: "是",
    route_no: "否",
    no_match_cell: "—",
    none: "（无）",
    streaming: "…",
    finished: "已完成（{tokens} 个 token）",
    failed: "失败",
    range_ge_le: "{ge} 到 {le}",
    range_gt_le: "大于 {gt}、最大 {le}",
    field_help: {
      name: "简短的名字，也可在聊天中用 /名字 选用：小写字母、数字、- 或 _。",
      description: "模板的用途；显示在聊天的模板列表中。",
      priority: "多个模板都匹配时，数字大的先被选用（整数，可以为负）。",
      keywords: "把消息交给此模板的词，每行一个。英文词只按整词匹配。",
      patterns: "把消息交给此模板的正则表达式，每行一个（熟悉正则的人使用）。",
      system: "对话开始前给模型的指示（可选）。",
      user: "模型收到的消息；{input} 处放入用户的文字（必填）。",
      variables: "带默认值的额外占位符，每行一个 `名字: 值`；在文本中写作 {名字}。",
      temperature: "回复的多样程度，{range}；留空则使用聊天的设置。",
      top_p: "只在可能性最高、累计占比不超过此值的词中选择，{range}；留空则使用聊天的设置。",
      max_tokens: "回复的最大长度（token 数），{range}；留空则使用聊天的设置。",
      stop: "模型写出这些文字时结束回复，每行一个。",
      route_on_demo: "离线演示模型回答时，是否按关键词和匹配规则把消息交给此模板。用 /名字 或在设置中选择时总会使用它。",
    },
  },
};

const LANG = (navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en";
const T = STRINGS[LANG];
// [field, how the form shows it: a line, a text block, a list (one item per line), a mapping, a number, a choice],
// in file order, and each number's range: both from the template schema (GET /fields), read at the start
let FIELDS = [];
let RANGES = {};
const CHECK_DELAY_MS = 350;

const state = { stem: null, base: null, isNew: false, view: "form", extra: {}, seq: 0, timer: null, yaml: "", tries: null };
const $ = (id) => document.getElementById(id);

function fill(text, params) {
  return text.replace(/\{(\w+)\}/g, (all, name) => (name in params ? String(params[name]) : all));
}

function t(key, params = {}) {
  return fill(T[key] ?? STRINGS.en[key] ?? key, params);
}

function rangeText(range) {
  const key = "range_" + Object.keys(range || {}).sort().join("_");  // ge_le, gt_le
  return key in T ? t(key, range) : "";
}

async function api(method, path, body) {
  const response = await fetch("/workshop/api" + path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  let data = {};
  try { data = await response.json(); } catch (e) { data = {}; }
  return { status: response.status, ok: response.ok, data };
}

function say(kind, text, hint = "") {
  const box = $("status-message");
  box.hidden = false;
  box.dataset.kind = kind;
  box.textContent = "";
  const main = document.createElement("span");
  main.className = "status-text";
  main.textContent = text;
  box.append(main);
  if (hint) {
    const more = document.createElement("span");
    more.className = "status-hint";
    more.textContent = " " + hint;
    box.append(more);
  }
}

function sayError(data) {
  const error = data.error || {};
  say(error.code === "workshop.conflict" ? "conflict" : "error", error.message || t("failed"), error.hint || "");
}

// ----- the form --------------------------------------------------------------------------------------------------
function buildForm() {
  const form = $("form-view");
  form.addEventListener("submit", (event) => event.preventDefault()); // Enter in a field submits nothing
  for (const [name, kind] of FIELDS) {
    const row = document.createElement("div");
    row.className = "field";
    row.dataset.field = name;
    const label = document.createElement("label");
    label.htmlFor = "field-" + name;
    label.textContent = name;
    const tag = kind === "block" || kind === "list" || kind === "mapping" ? "textarea" : kind === "choice" ? "select" : "input";
    const input = document.createElement(tag);
    if (kind === "choice") {
      for (const [value, key] of [["", "route_default"], ["true", "route_yes"], ["false", "route_no"]]) {
        const option = document.createElement("option");
        option.value = value;
        option.textContent = t(key);
        input.append(option);
      }
    }
    input.id = "field-" + name;
    input.dataset.kind = kind;
    input.spellcheck = false;
    if (input.tagName === "TEXTAREA") input.rows = kind === "block" ? 5 : 3;
    if (kind === "number") input.inputMode = "decimal";
    input.addEventListener(kind === "choice" ? "change" : "input", () => schedule());
    const help = document.createElement("p");
    help.className = "help";
    help.textContent = fill(T.field_help[name] || "", { range: rangeText(RANGES[name]) });
    row.append(label, input, help);
    form.append(row);
  }
}

function fillForm(fields) {
  state.extra = {};
  for (const [key, value] of Object.entries(fields || {})) {
    if (!FIELDS.some(([name]) => name === key)) state.extra[key] = value;
  }
  for (const [name, kind] of FIELDS) {
    const value = (fields || {})[name];
    let shown = "";
    if (value === undefined || value === null) shown = "";
    else if (kind === "list") shown = Array.isArray(value) ? value.join("\n") : String(value);
    else if (kind === "mapping") shown = typeof value === "object" ? Object.entries(value).map(([k, v]) => `${k}: ${v}`).join("\n") : String(value);
    else if (kind === "choice") shown = value === true ? "true" : value === false ? "false" : "";
    else shown = String(value);
    $("field-" + name).value = shown;
  }
}

function typed(text) {
  const trimmed = text.trim();
  return /^-?\d+(\.\d+)?$/.test(trimmed) ? Number(trimmed) : trimmed;  // anything else goes as typed: the check says
}

function formFields() {
  const fields = { ...state.extra };
  for (const [name, kind] of FIELDS) {
    const raw = $("field-" + name).value;
    if (kind === "list") fields[name] = raw.split("\n").map((s) => s.trim()).filter((s) => s);
    else if (kind === "mapping") {
      const mapping = {};
      for (const line of raw.split("\n")) {
        const at = line.indexOf(":");
        if (line.trim() && at > 0) mapping[line.slice(0, at).trim()] = typed(line.slice(at + 1));
      }
      fields[name] = mapping;
    } else if (kind === "number") fields[name] = raw.trim() === "" ? null : typed(raw);
    else if (kind === "choice") fields[name] = raw === "" ? null : raw === "true";
    else fields[name] = raw;
  }
  return fields;
}

function draftBody() {
  return state.view === "form" ? { stem: state.stem, fields: formFields() } : { stem: state.stem, yaml: $("yaml-text").value };
}

// ----- checking while typing -------------------------------------------------------------------------------------
function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(() => { check(); if ($("sample-message").value.trim()) preview(); }, CHECK_DELAY_MS);
}

async function check() {
  clearTimeout(state.timer);
  const seq = ++state.seq;
  const { ok, data } = await api("POST", "/check", draftBody());
  if (seq !== state.seq) return null;  // a newer check is on its way
  if (!ok) { sayError(data); return null; }
  state.yaml = data.yaml;
  showProblems(data.problems);
  return data;
}

function showProblems(problems) {
  const list = $("problems");
  list.textContent = "";
  for (const field of document.querySelectorAll(".field")) field.classList.remove("invalid");
  for (const problem of problems) {
    const item = document.createElement("li");
    item.className = "problem";
    item.dataset.field = problem.field || "";
    item.textContent = problem.text;
    list.append(item);
    const row = document.querySelector(`.field[data-field="${(problem.field || "").split(".")[0]}"]`);
    if (row) row.classList.add("invalid");
  }
  $("problems-none").hidden = problems.length > 0;
  $("problems-box").dataset.count = String(problems.length);
}

async function switchView(view) {
  if (view === state.view) return;
  const checked = await check();
  if (view === "form") {
    if (!checked || checked.fields === null) { say("error", t("fix_yaml_first")); return; }
    fillForm(checked.fields);
  } else {
    $("yaml-text").value = checked ? checked.yaml : state.yaml;
  }
  state.view = view;
  $("form-view").hidden = view !== "form";
  $("yaml-view").hidden = view !== "yaml";
  $("view-form").setAttribute("aria-selected", String(view === "form"));
  $("view-yaml").setAttribute("aria-selected", String(view === "yaml"));
}

// ----- the list and opening a template ---------------------------------------------------------------------------
async function loadList() {
  const { ok, data } = await api("GET", "/templates");
  if (!ok) { sayError(data); return; }
  const list = $("template-list");
  list.textContent = "";
  for (const row of data.templates) {
    const item = document.createElement("li");
    item.className = "template-row" + (row.stem === state.stem ? " open" : "");
    item.dataset.stem = row.stem;
    const title = document.createElement("div");
    title.className = "row-title";
    title.textContent = row.stem + (row.priority !== null ? ` · ${row.priority}` : "");
    const description = document.createElement("div");
    description.className = "row-description";
    description.textContent = row.description_shown || "";
    const words = document.createElement("div");
    words.className = "row-keywords";
    words.textContent = row.keywords.slice(0, 6).join(", ");
    item.append(title, description, words);
    if (row.route_on_demo === false) {
      const tag = document.createElement("div");
      tag.className = "row-demo-off";
      tag.textContent = t("demo_off_tag");
      item.append(tag);
    }
    if (row.problems) {
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = `⚠ ${row.problems}`;
      title.append(badge);
    }
    item.addEventListener("click", () => openTemplate(row.stem));
    list.append(item);
  }
}

function showEditor(stem, file) {
  stopTries();
  $("editor").hidden = false;
  $("editor-title").textContent = stem;
  $("editor-file").textContent = file;
  $("duplicate-button").disabled = state.isNew;
  $("delete-button").disabled = state.isNew;
  $("preview-result").hidden = true;
  $("try-result").hidden = true;
  $("diff-text").hidden = true;
  for (const row of document.querySelectorAll(".template-row")) row.classList.toggle("open", row.dataset.stem === stem);
}

function setText(yaml, fields) {
  state.yaml = yaml;
  $("yaml-text").value = yaml;
  fillForm(fields || {});
}

async function openTemplate(stem) {
  const { ok, data } = await api("GET", "/templates/" + encodeURIComponent(stem));
  if (!ok) { sayError(data); return; }
  Object.assign(state, { stem, base: data.version, isNew: false });
  showEditor(stem, data.file);
  setText(data.yaml, data.fields);
  showProblems(data.problems);
  await loadVersions();
}

function newTemplate() {
  const stem = $("new-stem").value.trim();
  if (!stem) { say("error", t("need_name")); return; }
  Object.assign(state, { stem, base: "absent", isNew: true });
  showEditor(stem, t("unsaved"));
  const starter = `name: ${stem}\ndescription: ""\npriority: 5\nkeywords: []\nuser: |\n  {input}\n`;
  setText(starter, { name: stem, description: "", priority: 5, keywords: [], user: "{input}\n" });
  $("versions").textContent = "";
  check();
}

async function duplicate() {
  const copy = $("new-stem").value.trim();
  if (!copy) { say("error", t("need_name")); return; }
  const { ok, data } = await api("POST", `/templates/${encodeURIComponent(state.stem)}/duplicate`, { stem: copy });
  if (!ok) { sayError(data); return; }
  say("ok", t("copied", { name: copy }));
  await loadList();
  await openTemplate(copy);
}

// ----- saving, deleting, versions --------------------------------------------------------------------------------
async function save() {
  await check();
  const body = { ...draftBody(), note: $("save-note").value.trim() };
  const { ok, data } = state.isNew
    ? await api("POST", "/templates", body)
    : await api("PUT", "/templates/" + encodeURIComponent(state.stem), { ...body, base: state.base });
  if (!ok) {
    sayError(data);
    if (data.problems) showProblems(data.problems);
    if (data.error && data.error.code === "workshop.conflict") await showConflict();
    return;
  }
  say("ok", state.isNew ? t("created", { name: state.stem }) : t("saved", { number: data.saved.number }));
  Object.assign(state, { base: data.version, isNew: false });
  $("save-note").value = "";
  showEditor(state.stem, data.file);
  await loadList();
  await loadVersions();
}

async function remove() {
  if (!window.confirm(t("confirm_delete", { name: state.stem }))) return;
  const { ok, data } = await api("DELETE", `/templates/${encodeURIComponent(state.stem)}?base=${encodeURIComponent(state.base)}`);
  if (!ok) { sayError(data); return; }
  say("ok", t("deleted", { name: state.stem }));
  $("editor").hidden = true;
  state.stem = null;
  await loadList();
}

async function loadVersions() {
  const list = $("versions");
  list.textContent = "";
  if (state.isNew) return;
  const { ok, data } = await api("GET", `/templates/${encodeURIComponent(state.stem)}/versions`);
  if (!ok) { sayError(data); return; }
  if (!data.versions.length) {
    const empty = document.createElement("li");
    empty.textContent = t("no_versions");
    list.append(empty);
  }
  for (const version of data.versions) {
    const item = document.createElement("li");
    item.className = "version" + (version.tag === data.current ? " current" : "");
    item.dataset.number = String(version.number);
    const text = document.createElement("span");
    text.className = "version-text";
    text.textContent = `#${version.number} · ${version.who} · ${version.when.replace("T", " ").replace("+00:00", " UTC")} · ${version.action}${version.note ? " · " + version.note : ""}`;
    const diff = document.createElement("button");
    diff.className = "diff-button";
    diff.textContent = t("diff_button");
    diff.addEventListener("click", () => showDiff(version.number));
    item.append(text, diff);
    if (version.action !== "deleted" && version.tag !== data.current) {
      const restore = document.createElement("button");
      restore.className = "restore-button";
      restore.textContent = t("restore_button");
      restore.addEventListener("click", () => restoreVersion(version.number));
      item.append(restore);
    }
    list.append(item);
  }
}

async function showConflict() {
  // what the other editor's version and this draft differ in, to merge by hand; the draft stays as it is
  await loadVersions();
  const { ok, data } = await api("POST", `/templates/${encodeURIComponent(state.stem)}/compare`, draftBody());
  if (ok) showDiffText(data.diff);
}

async function showDiff(number) {
  const { ok, data } = await api("GET", `/templates/${encodeURIComponent(state.stem)}/diff?old=${number}&new=current`);
  if (!ok) { sayError(data); return; }
  showDiffText(data.diff);
}

function showDiffText(diff) {
  const data = { diff };
  const box = $("diff-text");
  box.hidden = false;
  box.textContent = "";
  for (const line of data.diff.split("\n")) {
    const span = document.createElement("span");
    span.className = line.startsWith("+") ? "added" : line.startsWith("-") ? "removed" : "";
    span.textContent = line + "\n";
    box.append(span);
  }
}

async function restoreVersion(number) {
  const { ok, data } = await api("POST", `/templates/${encodeURIComponent(state.stem)}/restore`, { version: number, base: state.base });
  if (!ok) { sayError(data); if (data.error && data.error.code === "workshop.conflict") await loadVersions(); return; }
  say("ok", t("restored", { number, new: data.saved.number }));
  state.base = data.version;
  setText(data.yaml, data.fields);
  showProblems(data.problems);
  await loadList();
  await loadVersions();
}

// ----- preview and try -------------------------------------------------------------------------------------------
async function preview() {
  const message = $("sample-message").value;
  if (!message.trim() || !state.stem) return;
  const seq = state.seq;
  const { ok, data } = await api("POST", "/preview", { ...draftBody(), message });
  if (!ok) { sayError(data); return; }
  if (seq !== state.seq) return;
  showProblems(data.problems);
  const routing = data.routing;
  const mine = routing.candidates.find((c) => c.draft);
  const winner = routing.candidates.find((c) => c.name === routing.picked) || { priority: "" };
  showServing(data.serving);
  const outcome = $("routing-outcome");
  outcome.dataset.outcome = routing.outcome;
  outcome.dataset.picked = routing.picked;
  outcome.dataset.demo = String(routing.demo);
  outcome.textContent = t("outcome_" + routing.outcome, {
    picked: routing.picked, reason: routing.reason_shown, mine: mine ? mine.reason_shown : "", theirs: winner.priority,
    name: mine ? mine.name : state.stem, model: data.serving.model,
  });
  $("demo-note").hidden = !data.demo;
  $("demo-note").textContent = data.serving.routing;
  const body = $("routing-table").querySelector("tbody");
  body.textContent = "";
  for (const candidate of routing.candidates) {
    const row = document.createElement("tr");
    if (candidate.draft) row.className = "draft";
    if (candidate.name === routing.picked) row.classList.add("picked");
    let verdict = candidate.reason_shown || t("no_match_cell");
    if (candidate.reason_shown && routing.demo && !candidate.route_on_demo) verdict = t("demo_off_cell", { reason: verdict });
    for (const value of [candidate.name, candidate.priority, verdict]) {
      const cell = document.createElement("td");
      cell.textContent = String(value);
      row.append(cell);
    }
    body.append(row);
  }
  // exactly the request a new chat sends for this message (the same decision as the headline's)
  const request = data.request || {};
  $("rendered-system").textContent = request.system ?? t("none");
  $("rendered-user").textContent = request.user ?? "";
  $("rendered-sampling").textContent = data.request
    ? JSON.stringify(data.request.sampling, null, 1)
    : data.request_error ? `${data.request_error.message} ${data.request_error.hint}` : "";
  $("preview-result").hidden = false;
}

async function tryOne(body, out, signal) {
  out.textContent = "";
  out.dataset.state = "streaming";
  const note = document.createElement("div");
  note.className = "try-note";
  const text = document.createElement("div");
  text.className = "try-reply";
  out.append(text, note);
  note.textContent = t("streaming");
  let response;
  try {
    response = await fetch("/workshop/api/try", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      credentials: "same-origin", signal,
    });
  } catch (e) {
    out.dataset.state = "stopped";  // a newer try (or another template) took its place
    return;
  }
  if (!response.ok) {
    let data = {};
    try { data = await response.json(); } catch (e) { data = {}; }
    note.textContent = (data.error && data.error.message) || t("failed");
    out.dataset.state = "error";
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const handle = (event) => {
    if (event.text !== undefined) text.textContent += event.text;
    else if (event.error) { note.textContent = `${event.error.message} ${event.error.hint}`; out.dataset.state = "error"; }
    else if (event.done) { note.textContent = t("finished", { tokens: event.done.completion_tokens ?? "?" }); out.dataset.state = "done"; }
  };
  for (;;) {
    let chunk;
    try { chunk = await reader.read(); } catch (e) { out.dataset.state = "stopped"; return; }
    const { value, done } = chunk;
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + 1);
      if (line.trim()) handle(JSON.parse(line));
    }
  }
  if (out.dataset.state === "streaming") out.dataset.state = "error";
}

function stopTries() {
  // closing the requests closes the replies' streams on the server: the engine stops generating them
  if (state.tries) state.tries.abort();
  state.tries = null;
}

async function tryIt() {
  const message = $("sample-message").value;
  if (!message.trim()) return;
  stopTries();
  const tries = (state.tries = new AbortController());
  $("try-result").hidden = false;
  await Promise.all([
    tryOne({ ...draftBody(), message, side: "draft" }, $("try-draft"), tries.signal),
    tryOne({ stem: state.stem, message, side: "saved" }, $("try-saved"), tries.signal),
  ]);
}

// which model answers in the chat now, and what that means for routing (the server words it)
function showServing(serving) {
  const box = $("serving");
  box.hidden = false;
  box.dataset.demo = String(serving.demo);
  box.dataset.model = serving.model;
  $("serving-model").textContent = serving.text;
  $("serving-routing").textContent = serving.routing;
}

// ----- start -----------------------------------------------------------------------------------------------------
async function start() {
  document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";
  document.title = t("title");
  for (const el of document.querySelectorAll("[data-t]")) el.textContent = t(el.dataset.t);
  for (const el of document.querySelectorAll("[data-t-placeholder]")) el.placeholder = t(el.dataset.tPlaceholder);
  const { data: schema } = await api("GET", "/fields");
  FIELDS = schema.fields.map((f) => [f.name, f.kind]);
  RANGES = Object.fromEntries(schema.fields.map((f) => [f.name, f.range]));
  buildForm();
  const { data } = await api("GET", "/me");
  if (!data.may_edit) {
    $("access-denied").hidden = false;
    $("access-text").textContent = (data.error && data.error.message) || t("failed");
    $("access-hint").textContent = (data.error && data.error.hint) || "";
    $("login-link").hidden = !(data.error && data.error.code === "workshop.login_needed");
    return;
  }
  $("who").textContent = data.role ? t("who", { user: data.user, role: data.role }) : t("local");
  showServing(data.serving);
  $("workshop").hidden = false;
  $("view-form").addEventListener("click", () => switchView("form"));
  $("view-yaml").addEventListener("click", () => switchView("yaml"));
  $("yaml-text").addEventListener("input", () => schedule());
  $("sample-message").addEventListener("input", () => schedule());
  $("new-button").addEventListener("click", newTemplate);
  $("duplicate-button").addEventListener("click", duplicate);
  $("save-button").addEventListener("click", save);
  $("delete-button").addEventListener("click", remove);
  $("preview-button").addEventListener("click", preview);
  $("try-button").addEventListener("click", tryIt);
  await loadList();
  document.body.dataset.ready = "true";
}

start();
