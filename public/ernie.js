// The browser tab's own id, kept in the tab's sessionStorage (a reload keeps it, another tab has its own) and sent
// to the app as a cookie when the page connects: without login, a reloaded tab gets its chat back, and a reply still
// being written (backend/web/replies.py). Set before the chat connects (this script runs before Chainlit's).
(() => {
  const KEY = "ernie-tab";
  let tab = sessionStorage.getItem(KEY);
  if (!tab) {
    tab = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random().toString(16).slice(2)}`;
    sessionStorage.setItem(KEY, tab);
  }
  document.cookie = `ernie_tab=${tab}; path=/; SameSite=Strict`;
})();

// The first page's status under the logo: which model, engine and device answer, and the engine's state,
// in the reader's language (the app's /ernie/status words it; backend/web/page.py).
(() => {
  const BOX = "ernie-status";
  let timer = null;

  async function refresh(box) {
    let next = 5000;
    try {
      const lang = encodeURIComponent(navigator.language || "en-US");
      const response = await fetch(`/ernie/status?lang=${lang}`, { cache: "no-store" });
      const status = await response.json();
      box.querySelector(".ernie-tagline").textContent = status.tagline;
      box.querySelector(".ernie-serving").textContent = status.serving;
      const state = box.querySelector(".ernie-state");
      state.textContent = status.state;
      state.dataset.state = status.code;
      if (status.code !== "ready") next = 1000; // the seconds of a start go by one a second
    } catch (err) {
      next = 5000;
    }
    if (box.isConnected) timer = setTimeout(() => refresh(box), next);
  }

  function mount() {
    const screen = document.getElementById("welcome-screen");
    if (!screen || screen.querySelector(`#${BOX}`)) return;
    clearTimeout(timer);
    const box = document.createElement("div");
    box.id = BOX;
    box.innerHTML =
      '<p class="ernie-tagline"></p><p><span class="ernie-serving"></span> · <span class="ernie-state"></span></p>';
    screen.insertBefore(box, screen.children[1] || null); // under the logo
    refresh(box);
  }

  new MutationObserver(mount).observe(document.documentElement, { childList: true, subtree: true });
})();
