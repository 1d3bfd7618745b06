() => {
  /* EAGLE Lens page script (Gradio runs this function once the page has loaded):
     1. the guided tour: a card that points at one view after another, Next / Skip, shown on
        a first visit only (remembered in localStorage);
     2. hovering a node of the draft tree lights its row and column in the attention mask;
     3. in-page links: "#tree-size" opens the tab "Tree size for this machine", "#tour" starts
        the tour;
     4. on a phone, Generate scrolls the answer (the token stream) into view;
     5. a value typed outside a setting's range is kept (not clamped), for Generate to refuse.
     The tour's steps come from app/ui/explain.py (TOUR_STEPS), filled in by app/ui/blocks (page_script). */
  const TOUR_STEPS = __TOUR_STEPS__;
  const TOUR_KEY = "eagle-lens-tour-done";

  // A tab by its label. On a narrow screen Gradio moves the tabs that do not fit into an
  // overflow menu ("…"): then its entry there is clicked, so every tab the tour and the
  // links name is reachable on a phone too.
  const openTab = (label) => {
    if (!label) return;
    const same = (b) => b.textContent.trim() === label;
    const button = [...document.querySelectorAll("button[role=tab]")].find(same);
    if (button) {
      if (button.getAttribute("aria-selected") !== "true") button.click();
      return;
    }
    const hidden = [...document.querySelectorAll(".overflow-dropdown button")].find(same);
    if (hidden) hidden.click();
  };
  const narrow = () => window.innerWidth < 700;
  // run ``fn(element)`` once ``selector`` has a box (a tab just opened renders a moment later)
  const whenDrawn = (selector, fn, tries = 30) => {
    const el = document.querySelector(selector);
    if (el && el.getBoundingClientRect().height > 0) fn(el);
    else if (tries > 0) setTimeout(() => whenDrawn(selector, fn, tries - 1), 100);
  };

  // --- 1. the guided tour ------------------------------------------------------------------
  let tourIndex = -1;
  let card = null;
  const unmark = () => document.querySelectorAll(".lens-tour-target")
    .forEach((el) => el.classList.remove("lens-tour-target"));

  const endTour = () => {
    localStorage.setItem(TOUR_KEY, "1");
    unmark();
    if (card) card.remove();
    card = null;
    tourIndex = -1;
  };

  const showStep = (i) => {
    tourIndex = i;
    const [selector, tab, title, text] = TOUR_STEPS[i];
    openTab(tab);
    unmark();
    if (!card) {
      card = document.createElement("div");
      card.id = "lens-tour";
      card.setAttribute("role", "dialog");
      card.innerHTML = '<div class="lens-tour-title"></div><div class="lens-tour-text"></div>' +
        '<div class="lens-tour-buttons"><span class="lens-tour-count"></span>' +
        '<button type="button" class="lens-tour-skip">Skip</button>' +
        '<button type="button" class="lens-tour-next">Next</button></div>';
      card.querySelector(".lens-tour-skip").addEventListener("click", endTour);
      card.querySelector(".lens-tour-next").addEventListener("click", () =>
        tourIndex + 1 < TOUR_STEPS.length ? showStep(tourIndex + 1) : endTour());
      document.body.appendChild(card);
    }
    card.querySelector(".lens-tour-title").textContent = title;
    card.querySelector(".lens-tour-text").textContent = text;
    card.querySelector(".lens-tour-count").textContent = `${i + 1} / ${TOUR_STEPS.length}`;
    card.querySelector(".lens-tour-next").textContent = i + 1 < TOUR_STEPS.length ? "Next" : "Done";
    setTimeout(() => {   // after the tab switch has rendered its content
      const target = document.querySelector(selector);
      if (target) {
        target.classList.add("lens-tour-target");
        target.scrollIntoView({ block: narrow() ? "start" : "nearest" });
      }
      placeCard(target);
    }, 60);
  };

  // The card goes to the corner of the screen that covers least of what it points at
  // (on a phone: the top or the bottom edge, full width).
  const placeCard = (target) => {
    if (!card) return;
    const corners = narrow()
      ? [{ left: "8px", right: "8px", bottom: "8px", top: "auto" }, { left: "8px", right: "8px", top: "8px", bottom: "auto" }]
      : [{ right: "18px", bottom: "18px", left: "auto", top: "auto" }, { left: "18px", bottom: "18px", right: "auto", top: "auto" },
         { right: "18px", top: "18px", left: "auto", bottom: "auto" }, { left: "18px", top: "18px", right: "auto", bottom: "auto" }];
    card.style.width = narrow() ? "auto" : "340px";
    if (!target) { Object.assign(card.style, corners[0]); return; }
    const t = target.getBoundingClientRect();
    const covered = () => {
      const c = card.getBoundingClientRect();
      const w = Math.max(0, Math.min(c.right, t.right) - Math.max(c.left, t.left));
      const h = Math.max(0, Math.min(c.bottom, t.bottom) - Math.max(c.top, t.top));
      return w * h;
    };
    let best = null;
    for (const corner of corners) {
      Object.assign(card.style, corner);
      const area = covered();
      if (best === null || area < best.area) best = { corner, area };
      if (area === 0) break;
    }
    Object.assign(card.style, best.corner);
  };
  window.addEventListener("resize", () => {
    if (card && tourIndex >= 0) placeCard(document.querySelector(TOUR_STEPS[tourIndex][0]));
  });

  const startTour = () => showStep(0);
  if (!localStorage.getItem(TOUR_KEY)) {
    // wait until the page's first demo has drawn its tree, then start
    const wait = setInterval(() => {
      if (document.querySelector("#tree-plot .js-plotly-plot")) {
        clearInterval(wait);
        if (!localStorage.getItem(TOUR_KEY) && tourIndex < 0) startTour();
      }
    }, 300);
    setTimeout(() => clearInterval(wait), 30000);
  }

  // --- 3. in-page links --------------------------------------------------------------------
  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest("a[href]");
    if (!link) return;
    const href = link.getAttribute("href");
    if (href === "#tree-size") {
      event.preventDefault();
      openTab("Tree size for this machine");
      whenDrawn("#tree-size-tab", (tab) => tab.scrollIntoView({ block: "start" }));
    } else if (href === "#tour") {
      event.preventDefault();
      startTour();
    }
  });

  // --- 4. on a phone, Generate brings the answer into view -----------------------------------
  // The stage (tree, player) comes first in the page; on a narrow screen the token stream sits
  // ~1,300 px further down, so after Generate the page scrolls to it. What sits above it
  // changes height while the run starts (status, tree, player), which would move the answer
  // off screen again, so for the first seconds it is brought back whenever its top leaves
  // the screen, until the visitor scrolls by hand.
  const KEEP_ANSWER_MS = 8000;
  const showAnswer = () => {
    if (!narrow()) return;
    let byHand = false;
    const handScroll = () => { byHand = true; };
    window.addEventListener("touchmove", handScroll, { once: true, passive: true });
    window.addEventListener("wheel", handScroll, { once: true, passive: true });
    const started = Date.now();
    const keep = setInterval(() => {
      if (byHand || Date.now() - started > KEEP_ANSWER_MS) {
        clearInterval(keep);
        window.removeEventListener("touchmove", handScroll);
        window.removeEventListener("wheel", handScroll);
        return;
      }
      const stream = document.querySelector("#token-stream");
      const top = stream ? stream.getBoundingClientRect().top : 0;
      if (stream && (top < 0 || top > window.innerHeight - 120)) stream.scrollIntoView({ block: "start" });
    }, 200);
  };
  document.addEventListener("click", (event) => {
    if (event.target.closest && event.target.closest("#generate-btn")) showAnswer();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && event.target.closest && event.target.closest("#prompt")) showAnswer();
  });

  // --- 5. refusal, not clamping --------------------------------------------------------------
  // A setting's slider clamps a typed value into its range when the box loses focus, and the
  // run would then go ahead with another value than the one typed. The typed value is kept
  // instead: Generate's validator refuses it with a message naming the range.
  window.addEventListener("blur", (event) => {
    const box = event.target;
    if (!box || !box.matches || !box.matches("#settings-panel input[type=number]")) return;
    const value = parseFloat(box.value);
    const lo = parseFloat(box.min);
    const hi = parseFloat(box.max);
    if (Number.isFinite(value) && ((Number.isFinite(lo) && value < lo) || (Number.isFinite(hi) && value > hi))) {
      event.stopImmediatePropagation();
    }
  }, true);

  // --- 2. tree node -> its row and column in the attention mask ----------------------------
  const maskGraph = () => document.querySelector("#mask-plot .js-plotly-plot");

  const clearMask = () => {
    const gd = maskGraph();
    if (gd) gd.querySelectorAll(".lens-mask-band").forEach((el) => el.remove());
  };

  const band = (gd, left, top, width, height) => {
    const div = document.createElement("div");
    div.className = "lens-mask-band";
    Object.assign(div.style, { left: `${left}px`, top: `${top}px`, width: `${width}px`, height: `${height}px` });
    gd.appendChild(div);
  };

  const lightMask = (node) => {
    clearMask();
    const gd = maskGraph();
    if (!gd || !gd.data || !gd.data.length || !gd._fullLayout) return;
    const meta = gd.data[0].meta || {};
    const rows = meta.rows || [];
    const columns = meta.columns || [];
    const r = rows.indexOf(node);
    const c = columns.indexOf(node);
    const xa = gd._fullLayout.xaxis;
    const ya = gd._fullLayout.yaxis;
    if (!xa || !ya || (r < 0 && c < 0)) return;
    if (getComputedStyle(gd).position === "static") gd.style.position = "relative";
    const y0 = (i) => ya._offset + Math.min(ya.l2p(i - 0.5), ya.l2p(i + 0.5));
    const x0 = (i) => xa._offset + Math.min(xa.l2p(i - 0.5), xa.l2p(i + 0.5));
    const rowPx = Math.abs(ya.l2p(1) - ya.l2p(0));
    const colPx = Math.abs(xa.l2p(1) - xa.l2p(0));
    if (r >= 0) band(gd, xa._offset, y0(r), xa._length, rowPx);
    if (c >= 0) band(gd, x0(c), ya._offset, colPx, ya._length);
  };

  const hook = () => {
    const gd = document.querySelector("#tree-plot .js-plotly-plot");
    // hooked once per plotly event hub: a re-plot that purged the div gets a new hub (gd._ev)
    if (!gd || typeof gd.on !== "function" || (gd.__lensHooked && gd.__lensHooked === gd._ev)) return;
    gd.__lensHooked = gd._ev || true;
    gd.on("plotly_hover", (event) => {
      const point = event && event.points && event.points[0];
      // the head's nodes and the ones prompt lookup copied (app/viz/tree.py): customdata = node index
      if (point && point.data && (point.data.name === "nodes" || point.data.name === "copied nodes")) lightMask(point.customdata);
    });
    gd.on("plotly_unhover", clearMask);
  };
  setInterval(hook, 500);
}
