// The key page (/api-keys): a logged-in user's keys and usage, in English or Chinese (backend/api/router.py).
const ZH = {
  title: "API 密钥", name: "名称", create: "创建密钥", once: "请立即复制此密钥：它只显示这一次。", prefix: "密钥",
  created: "创建时间", used: "上次使用", usage: "用量", everyone: "所有人（管理员）", user: "用户", day: "日期（UTC）",
  route: "途径", requests: "请求数", prompt: "提示词元", reply: "回复词元", how: "如何使用密钥", revoke: "撤销",
  confirm: "撤销此密钥？使用它的工具将无法再访问。", as: "登录身份：", limits: "配额",
};
const zh = (navigator.language || "").toLowerCase().startsWith("zh");
const say = (key, en) => (zh && ZH[key]) || en;
if (zh) document.querySelectorAll("[data-t]").forEach((el) => { el.textContent = say(el.dataset.t, el.textContent); });
const headers = { "Content-Type": "application/json", "Accept-Language": navigator.language || "en" };
const api = async (path, options = {}) => {
  const resp = await fetch("/api-keys/api" + path, { credentials: "same-origin", headers, ...options });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error ? body.error.message : resp.statusText);
  return body;
};
const showError = (err) => { document.getElementById("error").textContent = err ? err.message || String(err) : ""; };
const cell = (row, text) => { const td = row.insertCell(); td.textContent = text == null ? "" : text; return td; };

async function loadKeys() {
  const body = await api("/keys");
  const tbody = document.querySelector("#keys tbody");
  tbody.replaceChildren();
  for (const key of body.keys) {
    const row = tbody.insertRow();
    row.dataset.id = key.id;
    cell(row, key.name); cell(row, key.prefix); cell(row, key.created_at); cell(row, key.last_used_at || "-");
    const button = document.createElement("button");
    button.textContent = say("revoke", "Revoke");
    button.className = "revoke";
    button.onclick = async () => {
      if (!confirm(say("confirm", "Revoke this key? Tools using it lose access."))) return;
      try { await api("/keys/" + encodeURIComponent(key.id), { method: "DELETE" }); showError(null); await loadKeys(); }
      catch (err) { showError(err); }
    };
    row.insertCell().append(button);
  }
}

async function loadUsage() {
  const everyone = document.getElementById("everyone").checked;
  const body = await api("/usage" + (everyone ? "?everyone=true" : ""));
  const tbody = document.querySelector("#usage tbody");
  tbody.replaceChildren();
  for (const u of body.usage) {
    const row = tbody.insertRow();
    for (const value of [u.user, u.day, u.route, u.requests, u.prompt_tokens, u.reply_tokens]) cell(row, value);
  }
}

async function start() {
  const me = await api("/me");
  if (me.error) { showError(me.error); return; }
  document.getElementById("who").textContent = say("as", "Logged in as ") + me.user + " (" + me.role + ")";
  const l = me.limits;
  document.getElementById("limits").textContent = say("limits", "Quotas") + ": " + l.concurrent + " / " +
    l.requests_per_minute + " per min / " + l.tokens_per_day + " tokens per day";
  document.getElementById("everyone-box").hidden = me.role !== "admin";
  document.getElementById("manage").hidden = false;
  document.getElementById("example").textContent =
    `curl ${location.origin}/v1/chat/completions \\\n  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \\\n` +
    `  -d '{"model": "${me.models[0]}", "messages": [{"role": "user", "content": "Hello"}]}'`;
  await loadKeys();
  await loadUsage();
}

document.getElementById("create").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const made = await api("/keys", { method: "POST", body: JSON.stringify({ name: document.getElementById("name").value }) });
    document.getElementById("new-key").textContent = made.key;
    document.getElementById("new").hidden = false;
    document.getElementById("name").value = "";
    showError(null);
    await loadKeys();
  } catch (err) { showError(err); }
};
document.getElementById("everyone").onchange = () => loadUsage().catch(showError);
start().catch(showError);
