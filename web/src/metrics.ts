import { html } from 'htm/preact'
import { useEffect, useRef, useState } from 'preact/hooks'
import { api } from './api'
import { bytes } from './format'

// Metrics is GET /v1/metrics, polled every 2 s: the account's own figures,
// the server's latencies, and for admin keys the server-wide counters
// (see internal/server/metrics_summary.go for who sees what). Rates are
// the change between two polls.
const period = 2000
const keep = 60

interface Sample { at: number; m: any }

function sum(o: Record<string, number> | undefined): number {
  return Object.values(o ?? {}).reduce((a, b) => a + b, 0)
}

function rate(prev: Sample | undefined, cur: Sample, f: (m: any) => number): number | undefined {
  if (!prev || cur.at <= prev.at) return undefined
  return Math.max(0, (f(cur.m) - f(prev.m)) / ((cur.at - prev.at) / 1000))
}

function Spark({ label, values }: { label: string; values: number[] }) {
  const w = 240, h = 40
  const max = Math.max(1e-9, ...values)
  const pts = values.map((v, i) => `${(i / Math.max(1, keep - 1)) * w},${h - (v / max) * h}`).join(' ')
  return html`<figure class="spark"><figcaption>${label} <span class="muted">now ${(values.at(-1) ?? 0).toFixed(2)}/s, max ${max.toFixed(2)}/s</span></figcaption>
    <svg viewBox=${`0 0 ${w} ${h}`} role="img" aria-label=${label}><polyline points=${pts} /></svg></figure>`
}

function Counts({ id, title, counts }: { id: string; title: string; counts: Record<string, number> }) {
  const keys = Object.keys(counts ?? {}).sort()
  return html`<div class="panel" id=${id}><h3>${title}</h3>
    ${keys.length === 0 ? html`<p class="muted">none</p>` : html`<table><tbody>
      ${keys.map(k => html`<tr key=${k}><td>${k}</td><td class="num">${counts[k]}</td></tr>`)}</tbody></table>`}
  </div>`
}

const ms = (s: number | undefined) => s === undefined ? '–' : `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`

function Latencies({ title, groups }: { title: string; groups: Record<string, any> }) {
  const keys = Object.keys(groups ?? {}).sort()
  return html`<tbody>${keys.map(k => html`<tr key=${title + k}><td>${title}</td><td>${k}</td>
    <td class="num">${ms(groups[k].p50)}</td><td class="num">${ms(groups[k].p90)}</td><td class="num">${ms(groups[k].p99)}</td></tr>`)}</tbody>`
}

export function Metrics() {
  const [samples, setSamples] = useState<Sample[]>([])
  const [err, setErr] = useState('')
  const hist = useRef<Sample[]>([])
  useEffect(() => {
    let stop = false, timer = 0
    const poll = async () => {
      try {
        const m = await api('GET', '/v1/metrics')
        hist.current = [...hist.current, { at: performance.now(), m }].slice(-keep)
        setSamples(hist.current)
        setErr('')
      } catch (x: any) { setErr(x.message) }
      if (!stop) timer = setTimeout(poll, period)
    }
    poll()
    return () => { stop = true; clearTimeout(timer) }
  }, [])
  if (samples.length === 0) return html`<section id="metrics"><h2>Metrics</h2>${err ? html`<p class="error">${err}</p>` : html`<p class="muted">Loading…</p>`}</section>`
  const cur = samples[samples.length - 1], m = cur.m
  const series = (f: (m: any) => number) => samples.map((s, i) => rate(samples[i - 1], s, f) ?? 0).slice(1)
  const ad = m.admin
  const sv = m.server
  let topRoutes: [string, number, number | undefined][] = []
  if (ad) {
    const prev = samples.length > 1 ? samples[samples.length - 2] : undefined
    topRoutes = Object.entries(ad.http_requests as Record<string, number>)
      .map(([k, v]): [string, number, number | undefined] => [k, v, rate(prev, cur, (x) => x.admin?.http_requests?.[k] ?? 0)])
      .sort((a, b) => b[1] - a[1]).slice(0, 12)
  }
  return html`<section id="metrics">
    <div class="bar"><h2>Metrics</h2><span class="muted" id="metrics-at">live · updated ${new Date(m.at).toLocaleTimeString()}</span></div>
    ${err && html`<p class="error">${err}</p>`}
    <h3>Your account</h3>
    <div class="panel"><${Spark} label="Your executions per second" values=${series((x) => sum(x.account.executions))} /></div>
    <div class="grid4">
      <${Counts} id="m-sandboxes" title="Your sandboxes by state" counts=${m.account.sandboxes} />
      <${Counts} id="m-executions" title="Your executions by status" counts=${m.account.executions} />
      <${Counts} id="m-exceeded" title="Limits reached" counts=${m.account.resource_exceeded} />
      <${Counts} id="m-violations" title="Security violations" counts=${m.account.security_violations} />
    </div>
    <h3>Service latency <span class="muted">(all accounts; from the server's histograms)</span></h3>
    <table id="m-latency"><thead><tr><th>What</th><th>By</th><th>p50</th><th>p90</th><th>p99</th></tr></thead>
      <${Latencies} title="sandbox create" groups=${sv.create_seconds} />
      <${Latencies} title="execution" groups=${sv.execution_seconds} />
      <${Latencies} title="agent call" groups=${sv.agent_call_seconds} />
      ${sv.preview_connect_seconds && html`<${Latencies} title="preview connect" groups=${{ '': sv.preview_connect_seconds }} />`}
    </table>
    ${ad && html`<h3 class="gap">Server (admin)</h3>
      <div class="panel" id="m-admin">
        <${Spark} label="Executions per second (all)" values=${series((x) => sum(x.admin.executions))} />
        <${Spark} label="HTTP requests per second" values=${series((x) => sum(x.admin.http_requests))} />
        <${Spark} label="Preview bytes per second" values=${series((x) => sum(x.admin.preview_bytes))} />
        <p>Sandboxes: ${Object.entries(ad.sandboxes).map(([k, v]) => `${k} ${v}`).join(', ')} · pool ready ${ad.pool_ready}
          · OOM kills ${ad.oom_kills} · preview requests ${ad.preview_requests}
          · goroutines ${ad.goroutines} · heap ${bytes(ad.heap_bytes)} · RSS ${bytes(ad.resident_bytes)}
          · CPU ${((rate(samples[samples.length - 2], cur, (x) => x.admin.process_cpu_seconds) ?? 0) * 100).toFixed(0)} %</p>
      </div>
      <div class="grid4">
        <${Counts} id="m-all-creates" title="Creates by pool" counts=${ad.creates} />
        <${Counts} id="m-all-executions" title="Executions by status" counts=${ad.executions} />
        <${Counts} id="m-all-exceeded" title="Limits reached" counts=${ad.resource_exceeded} />
        <${Counts} id="m-all-violations" title="Security violations" counts=${ad.security_violations} />
      </div>
      <table id="m-http"><thead><tr><th>HTTP route and code</th><th>Requests</th><th>Per second</th></tr></thead><tbody>
        ${topRoutes.map(([k, v, r]) => html`<tr key=${k}><td>${k}</td><td class="num">${v}</td><td class="num">${r === undefined ? '–' : r.toFixed(2)}</td></tr>`)}
      </tbody></table>`}
  </section>`
}
