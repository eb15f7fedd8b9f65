"""The live status page: a static HTML page that polls ``/status.json`` every second (with
the metrics key from the page's fragment, ``/status#key=...``, when one is set)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sluice.engine.runtime import Runtime
from sluice.server.errors import public_text


def status_json(runtime: Runtime) -> dict[str, Any]:
    """Queue, workers, resident models and batches, as plain JSON; exception text (a model's
    load error, a worker's cause of death) with its file paths redacted, as in error
    bodies (the detail is in the log)."""
    snap = runtime.snapshot()
    now = runtime.clock()
    workers = []
    statuses = snap.worker_status or ("up",) * len(snap.workers)
    for state, depth, status in zip(snap.workers, snap.inbox_depths, statuses, strict=True):
        workers.append({
            "worker_id": state.worker_id,
            "status": status,
            "inbox_depth": depth,
            "active": state.active_count,
            "budget_bytes": state.budget_bytes,
            "resident_bytes": state.resident_bytes,
            "last_batch_size": state.last_batch_size,
            "models": [model_entry(asdict(m), now) for m in state.models],
            "failed_models": {m: public_text(e) for m, e in state.failed_models.items()},
        })
    return {
        "queue_depth": snap.queue_depth,
        "queue_capacity": snap.queue_capacity,
        "live_requests": snap.live_requests,
        "draining": snap.draining,
        "completions_per_s": round(snap.completions_per_s, 3),
        "scheduler": runtime.config.scheduler,
        "router": runtime.config.router,
        "workers": workers,
        "variants": runtime.variants.snapshot(),
        "groups": runtime.variants.groups_snapshot(),
        "recoveries": [{**asdict(r), "cause": public_text(r.cause)}
                       for r in runtime.recoveries()],
    }


def model_entry(model: dict[str, Any], now: float) -> dict[str, Any]:
    """A resident model's status entry, with ``expires_in_s``: seconds until its keep-alive
    unloads it if no request comes first (``None``: in use, pinned or kept until evicted)."""
    expires = model.get("expires_at_s")
    model["expires_in_s"] = None if expires is None else round(max(0.0, expires - now), 3)
    return model


STATUS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sluice status</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} .sub{color:#666;margin-bottom:16px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:16px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:22px}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:16px}
th,td{border:1px solid #ddd;padding:6px 8px;text-align:left}
th{background:#f0f0f0} .bar{background:#e5e5e5;height:8px;border-radius:4px;width:120px}
.bar span{display:block;height:8px;border-radius:4px;background:#3b82f6}
</style></head><body>
<h1>sluice</h1><div class="sub" id="sub">connecting…</div>
<div class="cards">
 <div class="card">queue<b id="queue">–</b></div>
 <div class="card">live requests<b id="live">–</b></div>
 <div class="card">completions/s<b id="rate">–</b></div>
 <div class="card">state<b id="state">–</b></div>
</div>
<table><thead><tr><th>worker</th><th>inbox</th><th>active</th><th>memory</th>
<th>last batch</th><th>resident models (in use / KV blocks used)</th></tr></thead>
<tbody id="workers"></tbody></table>
<script>
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
async function tick(){
  try{
    const key=new URLSearchParams(location.hash.slice(1)).get('key');
    const r=await fetch('/status.json',key?{headers:{'X-Metrics-Key':key}}:{});
    if(!r.ok)throw new Error('HTTP '+r.status+(r.status===401?' (open /status#key=<metrics key>)':''));
    const s=await r.json();
    document.getElementById('sub').textContent=`scheduler ${s.scheduler} · router ${s.router} · updated ${new Date().toLocaleTimeString()}`;
    document.getElementById('queue').textContent=`${s.queue_depth} / ${s.queue_capacity}`;
    document.getElementById('live').textContent=s.live_requests;
    document.getElementById('rate').textContent=s.completions_per_s.toFixed(2);
    document.getElementById('state').textContent=s.draining?'draining':'serving';
    document.getElementById('workers').innerHTML=s.workers.map(w=>{
      const pct=w.budget_bytes?Math.round(100*w.resident_bytes/w.budget_bytes):0;
      const models=w.models.map(m=>{
        const kv=m.kv_total_blocks?` · KV ${m.kv_total_blocks-m.kv_free_blocks}/${m.kv_total_blocks}`:'';
        return `${esc(m.model_id)} (${m.in_use}${kv})`}).join(', ')||'—';
      return `<tr class="worker"><td>${w.worker_id}</td><td>${w.inbox_depth}</td><td>${w.active}</td>`+
        `<td><div class="bar"><span style="width:${pct}%"></span></div>${pct}%</td>`+
        `<td>${w.last_batch_size}</td><td>${models}</td></tr>`}).join('');
  }catch(e){document.getElementById('sub').textContent='disconnected: '+e}
}
tick();setInterval(tick,1000);
</script></body></html>
"""
