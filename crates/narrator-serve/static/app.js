// narrator serve's page: live updates over what the server already rendered (every page
// shows its work without this script). Plain JavaScript, no build step.
"use strict";

const FINAL = ["done", "failed", "cancelled"];

function percent(job) {
  return job.segments ? Math.floor((100 * job.segments_done) / job.segments) : 0;
}

function hms(seconds) {
  const s = Math.max(0, Math.round(seconds));
  return `${Math.floor(s / 3600)}:${String(Math.floor(s / 60) % 60).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
}

// The job page: progress and state from the job's Server-Sent Events; the page is
// loaded again at a final state, to show its players and downloads.
function followJob(section) {
  const id = section.dataset.id;
  if (FINAL.includes(section.dataset.state)) return;
  const events = new EventSource(`/v1/jobs/${id}/events`);
  const update = (e) => {
    const job = JSON.parse(e.data);
    const bar = document.getElementById("progress");
    bar.max = job.segments;
    bar.value = job.segments_done;
    document.getElementById("progress-text").textContent =
      `${job.segments_done} of ${job.segments} segments (${percent(job)}%)`;
    document.getElementById("audio-length").textContent = hms(job.audio_seconds);
    const state = document.getElementById("state");
    state.textContent = job.state;
    state.className = `state state-${job.state}`;
    section.dataset.state = job.state;
    if (FINAL.includes(job.state)) {
      events.close();
      window.location.reload();
    }
  };
  events.addEventListener("state", update);
  events.addEventListener("progress", update);
}

// The jobs list: each row's state and progress, every 2 s while any is unfinished.
function followList(table) {
  const refresh = async () => {
    const state = table.dataset.state;
    const res = await fetch(`/v1/jobs?limit=100${state ? `&state=${state}` : ""}`);
    if (!res.ok) return;
    const { data } = await res.json();
    let unfinished = false;
    for (const job of data) {
      const row = table.querySelector(`tr[data-id="${job.id}"]`);
      if (!row) continue;
      const cell = row.querySelector(".state");
      cell.textContent = job.state;
      cell.className = `state state-${job.state}`;
      const bar = row.querySelector("progress");
      bar.value = percent(job);
      row.querySelector(".pct").textContent = `${percent(job)}%`;
      unfinished ||= !FINAL.includes(job.state);
    }
    if (unfinished) setTimeout(refresh, 2000);
  };
  const rows = [...table.querySelectorAll(".state")];
  if (rows.some((c) => !FINAL.includes(c.textContent.trim()))) setTimeout(refresh, 2000);
}

// The voice picker's preview.
function previews() {
  const button = document.querySelector("[data-voice-preview]");
  if (!button) return;
  const audio = document.getElementById("preview-audio");
  button.addEventListener("click", () => {
    const voice = document.getElementById("voice").value;
    audio.src = `/v1/voices/${encodeURIComponent(voice)}/preview`;
    audio.play().catch(() => {});
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const job = document.getElementById("job");
  if (job) followJob(job);
  const table = document.getElementById("jobs");
  if (table) followList(table);
  previews();
});
