// fleetledger's live page: the runs of a ledger, and one run as it happens.
//
// Everything shown comes from /api/v1/ (docs/http.md) and the run's stream; every text
// from the ledger goes in with textContent (data is never markup). The one block of
// markup set as such is the timeline, drawn and escaped by the server's painter.
"use strict";

const API = "/api/v1";
const KEPT_ENTRIES = 200; // rows of "latest" kept on the page
const TIMELINE_EVERY_MS = 2000; // at most one timeline redraw this often while live
const RUNS_EVERY_MS = 5000;
const FAULTS_EVERY_MS = 5000; // what each fault cost: a replay of the run, so not on every seq
const VERSIONS_SHOWN = 8; // rows of "weights served" (the newest versions)

// ── the token ──────────────────────────────────────────────────────────────────
//
// A server off loopback needs its token (docs/http.md, Security): opened as
// /#token=TOKEN, the page keeps it for this tab and takes it out of the address bar.
// The fragment is never sent to a server nor logged; the API gets it in a header, and
// the stream — which a browser opens without headers — in the cookie the server sets
// on the first answer to a request that showed it.

const TOKEN = (() => {
  const found = location.hash.match(/^#token=([^&]+)/);
  if (found) {
    sessionStorage.setItem("fleetledger-token", decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("fleetledger-token");
})();

function authorized(headers) {
  return TOKEN ? { ...headers, Authorization: `Bearer ${TOKEN}` } : headers;
}

// ── small helpers ──────────────────────────────────────────────────────────────

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

async function getJSON(url) {
  const response = await fetch(url, { headers: authorized({ Accept: "application/json" }) });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(body && body.error ? body.error : `${response.status} ${response.statusText}`);
  }
  return body;
}

async function getText(url) {
  const response = await fetch(url, { headers: authorized({}) });
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw new Error(body && body.error ? body.error : `${response.status} ${response.statusText}`);
  }
  return response.text();
}

function runPath(run, tail) {
  return `${API}/runs/${encodeURIComponent(run)}/${tail}`;
}

function clock(iso) {
  // 2026-12-02T19:08:31.054677Z → 19:08:31.054 (the date is in the run's header)
  return iso ? iso.slice(11, 23) : "";
}

function setLive(state, words) {
  const live = document.getElementById("live");
  live.className = `live ${state}`;
  live.textContent = words;
}

function problem(where, error) {
  return el("p", { class: "problem" }, `${where}: ${error.message}`);
}

let leaving = () => {}; // what the current view must stop when another replaces it

// ── the runs ───────────────────────────────────────────────────────────────────

async function showRuns() {
  const main = document.getElementById("main");
  document.title = "fleetledger — runs";
  const holder = el("div", {}, el("p", { class: "muted" }, "loading…"));
  main.replaceChildren(el("h1", {}, "Runs"), holder);
  setLive("", "");
  const draw = async () => {
    try {
      holder.replaceChildren(runsTable(await getJSON(`${API}/runs`)));
    } catch (error) {
      holder.replaceChildren(problem("runs", error));
    }
  };
  await draw();
  const timer = setInterval(draw, RUNS_EVERY_MS);
  leaving = () => clearInterval(timer);
}

function runsTable(runs) {
  if (!runs.length) return el("p", { class: "muted" }, "no runs in this ledger");
  const rows = runs
    .slice()
    .reverse() // newest first
    .map((r) =>
      el(
        "tr",
        {},
        el("td", { class: "code" }, el("a", { href: `/runs/${encodeURIComponent(r.run)}` }, r.run)),
        el("td", { class: "num" }, r.events),
        el("td", { class: "num" }, r.started.slice(0, 19).replace("T", " ")),
        el("td", { class: "num" }, r.last_event.slice(0, 19).replace("T", " ")),
        el("td", {}, r.ended ? (r.cause ? `${r.outcome}: ${r.cause}` : r.outcome) : "running"),
      ),
    );
  return el(
    "table",
    { class: "runs" },
    el("thead", {}, el("tr", {}, ...["run", "events", "started (UTC)", "last event", "outcome"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows),
  );
}

// ── one run ────────────────────────────────────────────────────────────────────

class RunPage {
  constructor(run) {
    this.run = run;
    this.source = null;
    this.selected = null; // the shard whose explanation is open
    this.membershipTimer = null;
    this.timelineBusy = false;
    this.timelineDue = false;
    this.timelineAt = 0;
    this.ended = false;
    this.parts = {
      status: el("div", { class: "status" }),
      outcome: el("div", {}),
      shards: el("div", {}),
      layout: el("div", { class: "layout" }),
      explain: el("div", { id: "explain" }),
      served: el("div", { id: "served" }),
      faults: el("div", { id: "faults" }, el("p", { class: "muted" }, "reading…")),
      timeline: el("div", { id: "timeline" }, el("p", { class: "muted" }, "drawing…")),
      entries: el("tbody", {}),
      entriesProblem: el("div", {}),
    };
  }

  async open() {
    const p = this.parts;
    document.title = `fleetledger — ${this.run}`;
    document.getElementById("main").replaceChildren(
      el("h1", {}, this.run),
      p.status,
      p.outcome,
      el("div", {}, el("button", { type: "button", id: "explain-run", onclick: () => this.explain(null) }, "why is the run where it is?")),
      el("h2", {}, "Shards"),
      p.shards,
      p.layout,
      p.explain,
      el("h2", {}, "Weights served"),
      p.served,
      el("h2", {}, "What each fault cost"),
      p.faults,
      el("h2", {}, "Timeline"),
      p.timeline,
      el("h2", {}, "Latest"),
      p.entriesProblem,
      el(
        "table",
        { class: "entries" },
        el("thead", {}, el("tr", {}, ...["time (UTC)", "seq", "shard", "what", "why"].map((h) => el("th", {}, h)))),
        p.entries,
      ),
    );
    leaving = () => this.close();
    await this.start();
  }

  // The first answers, then the stream. A run that has not started yet (the page of a
  // run being launched) or a ledger that cannot be read now: say so, ask again shortly.
  async start() {
    const [known, after] = await Promise.all([this.loadMembership(), this.loadLatest()]);
    if (!known || after === null) {
      setLive("off", "waiting for the run…");
      this.retryTimer = setTimeout(() => this.start(), 1000);
      return;
    }
    this.parts.entriesProblem.replaceChildren();
    this.drawTimeline();
    this.loadFaults();
    this.follow(after);
  }

  close() {
    if (this.source) this.source.close();
    clearTimeout(this.membershipTimer);
    clearTimeout(this.retryTimer);
    clearTimeout(this.timelineTimer);
    clearTimeout(this.faultsTimer);
  }

  // The stream: new entries as they are appended; "head" whenever the run moves.
  follow(after) {
    this.lastId = this.lastId || after;
    const url = `${runPath(this.run, "stream")}?after=${encodeURIComponent(this.lastId)}`;
    const source = (this.source = new EventSource(url));
    setLive("off", "connecting…");
    source.onopen = () => setLive("on", "live");
    source.addEventListener("entry", (event) => this.addEntries([JSON.parse(event.data)], true));
    source.addEventListener("head", () => {
      this.soon();
      this.drawTimeline();
      this.faultsSoon();
    });
    source.addEventListener("ended", () => {
      source.close();
      this.ended = true;
      setLive("ended", "run ended");
      this.loadMembership();
      this.drawTimeline(true);
      this.loadFaults();
    });
    source.addEventListener("error", (event) => {
      if (event.data) {
        // the server's own words: the ledger failed mid-stream; the browser reconnects
        this.parts.entriesProblem.replaceChildren(problem("stream", new Error(JSON.parse(event.data).error)));
      }
      if (this.ended) return;
      setLive("off", "reconnecting…");
      // The browser reconnects by itself after a dropped connection, but never after
      // an answer that is not 200 (a 503 while the ledger is migrated): open it again.
      if (source.readyState === EventSource.CLOSED) {
        this.retryTimer = setTimeout(() => this.follow(this.lastId), 2000);
      }
    });
  }

  soon() {
    clearTimeout(this.membershipTimer);
    this.membershipTimer = setTimeout(() => this.loadMembership(), 150);
  }

  async loadMembership() {
    try {
      this.drawMembership(await getJSON(runPath(this.run, "membership")));
      return true;
    } catch (error) {
      this.parts.shards.replaceChildren(problem("membership", error));
      return false;
    }
  }

  async loadLatest() {
    try {
      const page = await getJSON(`${runPath(this.run, "history")}?limit=${KEPT_ENTRIES}`);
      this.parts.entries.replaceChildren(); // a second try must not show them twice
      this.lastId = null;
      this.addEntries(page.entries, false);
      this.ended = page.ended;
      if (page.ended) setLive("ended", "run ended");
      this.lastId = page.stream_after;
      return page.stream_after;
    } catch (error) {
      this.parts.entriesProblem.replaceChildren(problem("history", error));
      return null;
    }
  }

  drawMembership(doc) {
    const p = this.parts;
    p.status.replaceChildren(
      `seq ${doc.seq} · ${doc.at.slice(0, 19).replace("T", " ")} UTC · epoch ${doc.epoch} · ` +
        `weights v${doc.weight_version} · serving [${doc.serving}] · absent [${doc.absent}]` +
        (doc.suspected.length ? ` · suspected [${doc.suspected}]` : "") +
        (doc.open_refit ? ` · refit to v${doc.open_refit.weight_version} in progress` : ""),
    );
    const lines = [];
    if (doc.ended) {
      const bad = doc.ended.outcome !== "completed";
      lines.push(el("p", { class: bad ? "outcome bad" : "outcome" }, `ended: ${doc.ended.outcome} at seq ${doc.ended.seq}: ${doc.ended.cause}`));
    }
    if (doc.exhausted) lines.push(el("p", { class: "outcome bad" }, `exhausted: ${doc.exhausted}`));
    p.outcome.replaceChildren(...lines);
    const rows = Object.entries(doc.shards).map(([index, s]) => {
      const row = el(
        "tr",
        { class: `state-${s.state}`, "data-shard": index, "data-state": s.state, onclick: () => this.explain(Number(index)) },
        el("td", { class: "num" }, index),
        el("td", {}, el("span", { class: "chip" }, s.state)),
        el("td", { class: "num" }, `${clock(s.since_at)} (seq ${s.since_seq})`),
        el("td", {}, s.since_rule),
        el("td", { class: "num" }, `v${s.weight_version}`),
        el("td", { class: "url" }, s.base_url),
        el("td", { class: "num" }, s.restart_attempts),
      );
      if (Number(index) === this.selected) row.classList.add("selected");
      return row;
    });
    p.shards.replaceChildren(
      el(
        "table",
        { class: "shards" },
        el("thead", {}, el("tr", {}, ...["shard", "state", "since", "why", "weights", "base URL", "restarts"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows),
      ),
    );
    p.layout.replaceChildren(layoutWords(doc));
    p.served.replaceChildren(...servedParts(doc.served, doc.trainer_version));
    if (this.selected !== null && this.explained !== doc.seq) this.explain(this.selected, true);
  }

  // A shard's explanation (or the run's, for null), under the table; a second click closes it.
  async explain(shard, refresh) {
    const p = this.parts;
    if (!refresh && shard === this.selected && p.explain.childElementCount) {
      this.selected = null;
      p.explain.replaceChildren();
      this.markSelected();
      return;
    }
    this.selected = shard;
    this.markSelected();
    const url = shard === null ? runPath(this.run, "explain") : runPath(this.run, `shards/${shard}/explain`);
    try {
      const answer = await getJSON(url);
      this.explained = answer.seq;
      const title = shard === null ? "Why the run is where it is" : `Why shard ${shard} is ${answer.state}`;
      p.explain.replaceChildren(
        el("div", { class: "explain-head" }, el("h2", {}, title), el("span", { class: "muted" }, `as of seq ${answer.seq}`)),
        el("pre", { class: "explanation", "data-shard": shard === null ? "run" : String(shard) }, answer.text),
      );
    } catch (error) {
      p.explain.replaceChildren(problem("explain", error));
    }
  }

  markSelected() {
    for (const row of this.parts.shards.querySelectorAll("tbody tr")) {
      row.classList.toggle("selected", Number(row.dataset.shard) === this.selected);
    }
  }

  addEntries(entries, fresh) {
    const body = this.parts.entries;
    for (const entry of entries) {
      const words = entry.words || { shards: "", what: entry.kind, detail: "", tone: "" };
      const tone = words.tone ? `tone-${words.tone.replace(/\s+/g, "-")}` : "";
      const row = el(
        "tr",
        { class: `${tone}${fresh ? " fresh" : ""}`, "data-id": entry.id, "data-kind": entry.kind },
        el("td", { class: "num" }, clock(entry.at)),
        el("td", { class: "num" }, entry.seq),
        el("td", { class: "num" }, words.shards),
        el("td", { class: "what" }, words.what),
        el("td", {}, words.detail),
      );
      body.prepend(row);
      this.lastId = entry.id;
    }
    while (body.childElementCount > KEPT_ENTRIES) body.lastElementChild.remove();
  }

  // What each fault cost: the run's explanation's faults (a replay of the run on the
  // server), asked at most every FAULTS_EVERY_MS while the run moves.
  faultsSoon() {
    if (!this.faultsTimer) {
      this.faultsTimer = setTimeout(() => {
        this.faultsTimer = null;
        this.loadFaults();
      }, FAULTS_EVERY_MS);
    }
  }

  async loadFaults() {
    if (this.faultsBusy) return;
    this.faultsBusy = true;
    try {
      const answer = await getJSON(runPath(this.run, "explain"));
      this.parts.faults.replaceChildren(faultsTable(answer.faults, answer.seq));
    } catch (error) {
      this.parts.faults.replaceChildren(problem("faults", error));
    } finally {
      this.faultsBusy = false;
    }
  }

  // The timeline: redrawn by the server's painter, at most every TIMELINE_EVERY_MS.
  async drawTimeline(force) {
    if (this.timelineBusy || (!force && Date.now() - this.timelineAt < TIMELINE_EVERY_MS)) {
      this.timelineDue = true;
      if (!this.timelineTimer) {
        this.timelineTimer = setTimeout(() => {
          this.timelineTimer = null;
          if (this.timelineDue) this.drawTimeline();
        }, TIMELINE_EVERY_MS);
      }
      return;
    }
    this.timelineBusy = true;
    this.timelineDue = false;
    try {
      const markup = await getText(`${runPath(this.run, "timeline")}?format=html`);
      this.parts.timeline.innerHTML = markup; // the painter's markup: every text escaped there
    } catch (error) {
      this.parts.timeline.replaceChildren(problem("timeline", error));
    } finally {
      this.timelineBusy = false;
      this.timelineAt = Date.now();
    }
  }
}

// The rank layout in the one notation every output uses (the server's words).
function layoutWords(doc) {
  return doc.layout ? `rank layout: ${doc.layout_words}` : `rank layout: none (${doc.layout_error})`;
}

// The rollouts by the weights their engines attested, and how stale they were.
function servedParts(served, trainerVersion) {
  const byVersion = Object.entries(served.by_version).map(([v, n]) => [Number(v), n]);
  const attested = byVersion.reduce((sum, [, n]) => sum + n, 0);
  if (!attested && !served.unknown) return [el("p", { class: "muted" }, "no rollouts reported yet")];
  const parts = [
    el(
      "p",
      { class: "served-line" },
      `${attested + served.unknown} rollouts reported · ${served.unknown} nobody attested` +
        (served.partial ? ` · ${served.partial} from partial weights` : ""),
    ),
  ];
  const newest = byVersion.slice(-VERSIONS_SHOWN).reverse();
  const earlier = byVersion.slice(0, -VERSIONS_SHOWN);
  const rows = newest.map(([v, n]) => el("tr", { "data-version": v }, el("td", { class: "num" }, `v${v}`), el("td", { class: "num" }, n)));
  if (earlier.length) {
    const n = earlier.reduce((sum, [, k]) => sum + k, 0);
    rows.push(el("tr", {}, el("td", { class: "muted" }, `… ${earlier.length} earlier versions`), el("td", { class: "num" }, n)));
  }
  const total = {};
  for (const perStep of Object.values(served.staleness)) {
    for (const [behind, n] of Object.entries(perStep)) total[behind] = (total[behind] || 0) + n;
  }
  const latest = served.staleness[String(trainerVersion)] || {};
  const behinds = Object.keys(total).map(Number).sort((a, b) => a - b);
  const stale = behinds.map((b) =>
    el("tr", { "data-behind": b }, el("td", { class: "num" }, b), el("td", { class: "num" }, total[b]), el("td", { class: "num" }, latest[String(b)] || 0)),
  );
  parts.push(
    el(
      "div",
      { class: "served-tables" },
      el(
        "table",
        { class: "versions" },
        el("thead", {}, el("tr", {}, el("th", {}, "weights"), el("th", {}, "rollouts"))),
        el("tbody", {}, ...rows),
      ),
      el(
        "table",
        { class: "staleness" },
        el("thead", {}, el("tr", {}, ...["versions behind the trainer", "rollouts", `at trainer v${trainerVersion}`].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...stale),
      ),
    ),
  );
  for (const [shard, said, recorded] of served.contradicted) {
    parts.push(el("p", { class: "problem" }, `shard ${shard} said v${said} where the ledger recorded v${recorded}`));
  }
  return parts;
}

// What each fault cost, one row each; what the ledger cannot say is "unknown".
function faultsTable(faults, seq) {
  if (!faults.length) return el("p", { class: "muted" }, `no fault as of seq ${seq}`);
  const known = (n) => (n === null || n === undefined ? "unknown" : n);
  const seconds = (s) => (s === null || s === undefined ? "—" : `${s.toFixed(2)} s`);
  const rows = faults.map((f) =>
    el(
      "tr",
      { "data-kind": f.kind, "data-seq": f.seq },
      el("td", { class: "num" }, f.seq),
      el("td", {}, f.kind.replace("_", " ")),
      el("td", { class: "num" }, f.shards.join(" ")),
      el("td", { class: "num" }, seconds(f.detection_s)),
      el("td", { class: "num" }, f.kind === "stall" ? "—" : f.readmitted_s === null ? "not yet" : seconds(f.readmitted_s)),
      el("td", { class: "num" }, f.out_of_service_s.toFixed(1)),
      el("td", { class: "num" }, f.in_flight === null ? `unknown (≥ ${f.failures_seen} failed)` : f.in_flight),
      el("td", { class: "num" }, known(f.redispatched)),
      el("td", { class: "num" }, known(f.dropped)),
      el("td", { class: "num" }, known(f.ended_run)),
      el("td", { class: "num" }, `${f.partial_served} / ${f.stale_served}`),
      el("td", {}, f.what),
    ),
  );
  const heads = ["seq", "fault", "shards", "detected in", "back after", "shard-s out", "in flight", "re-dispatched", "dropped", "ended run", "partial / stale", "why"];
  return el(
    "table",
    { class: "faults" },
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows),
  );
}

// ── routing ────────────────────────────────────────────────────────────────────

function route() {
  leaving();
  leaving = () => {};
  const match = location.pathname.match(/^\/runs\/(.+)$/);
  if (match) new RunPage(decodeURIComponent(match[1])).open();
  else showRuns();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("ledger").textContent = document.body.dataset.ledger || "";
  route();
});
