import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api } from './api'

// Bars is a bar chart in SVG of one figure per day.
function Bars({ title, groups, field }: { title: string; groups: any[]; field: string }) {
  const w = 560, h = 140, pad = 24
  const max = Math.max(1e-9, ...groups.map(g => g[field]))
  const bw = groups.length ? (w - pad) / groups.length : 0
  return html`<figure class="chart">
    <figcaption>${title} <span class="muted">(max ${max.toFixed(max < 10 ? 2 : 0)})</span></figcaption>
    <svg viewBox=${`0 0 ${w} ${h + 18}`} role="img" aria-label=${title}>
      ${groups.map((g, i) => {
        const bh = (g[field] / max) * h
        return html`<g><title>${g.key}: ${g[field]}</title>
          <rect x=${pad + i * bw + 2} y=${h - bh} width=${Math.max(1, bw - 4)} height=${bh} />
          ${groups.length <= 31 && html`<text x=${pad + i * bw + bw / 2} y=${h + 14} text-anchor="middle">${g.key.slice(8, 10)}</text>`}</g>`
      })}
      <line x1=${pad} y1=${h} x2=${w} y2=${h} />
    </svg>
  </figure>`
}

function fmtBytes(n: number): string {
  return n < 1 << 20 ? `${(n / 1024).toFixed(1)} KB` : `${(n / (1 << 20)).toFixed(1)} MB`
}

function Gauge({ label, used, limit }: { label: string; used: number; limit: number }) {
  if (!limit) return html`<div class="gauge"><span>${label}</span><span class="muted">${used.toFixed(0)} (no limit)</span></div>`
  const pct = Math.min(100, (used / limit) * 100)
  return html`<div class="gauge"><span>${label}</span>
    <meter min="0" max="100" low="80" high="95" optimum="0" value=${pct}></meter>
    <span class="muted">${used.toFixed(0)} / ${limit} (${pct.toFixed(0)} %)</span></div>`
}

export function Usage({ account }: { account: any }) {
  const [usage, setUsage] = useState<any>(null)
  const [credits, setCredits] = useState<any>(null)
  const [err, setErr] = useState('')
  useEffect(() => {
    const from = new Date(Date.now() - 30 * 86400e3).toISOString()
    api('GET', `/v1/account/usage?group_by=day&from=${encodeURIComponent(from)}`).then(setUsage, (x) => setErr(x.message))
    api('GET', '/v1/account/credits').then(setCredits, () => {})
  }, [])
  const l = account.limits ?? {}, m = account.month?.usage ?? {}
  return html`<section id="usage">
    <h2>Usage</h2>
    ${err && html`<p class="error">${err}</p>`}
    <div class="panel"><h3>This month's quotas</h3>
      <${Gauge} label="Sandbox-seconds" used=${m.sandbox_seconds ?? 0} limit=${l.monthly_sandbox_seconds} />
      <${Gauge} label="CPU-seconds" used=${m.cpu_seconds ?? 0} limit=${l.monthly_cpu_seconds} />
      <${Gauge} label="GB-seconds" used=${m.gb_seconds ?? 0} limit=${l.monthly_gb_seconds} />
      <${Gauge} label="Executions" used=${m.executions ?? 0} limit=${l.monthly_executions} />
      <${Gauge} label="Running sandboxes" used=${account.running_sandboxes ?? 0} limit=${l.max_sandboxes} />
      ${account.storage && html`<h3>Kept in the database <span class="muted">${fmtBytes(account.storage.bytes)}, ${account.storage.records} records</span></h3>
        ${Object.entries(account.storage.kinds ?? {}).map(([kind, k]: [string, any]) =>
          html`<${Gauge} label=${kind + ' (KB)'} used=${k.bytes / 1024} limit=${k.max_bytes > 0 ? Math.round(k.max_bytes / 1024) : 0} />`)}`}
      ${credits && html`<p>Credits: <strong>${credits.balance}</strong> <span class="muted">(spent ${credits.spent ?? '?'})</span></p>`}
    </div>
    ${usage && html`<div class="panel"><h3>Last 30 days <span class="muted">total cost ${usage.total.cost}</span></h3>
      <${Bars} title="Executions per day" groups=${usage.groups} field="executions" />
      <${Bars} title="CPU-seconds per day" groups=${usage.groups} field="cpu_seconds" />
      <${Bars} title="GB-seconds (reserved) per day" groups=${usage.groups} field="gb_seconds_reserved" />
      <${Bars} title="Storage GB-seconds per day" groups=${usage.groups} field="storage_gb_seconds" />
    </div>`}
  </section>`
}
