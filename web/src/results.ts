import { html } from 'htm/preact'

// Result renders one rich result. What a sandbox produces is untrusted:
// images are data URLs, HTML goes in a sandboxed frame that runs no script
// (and has an origin of its own), text is text.
export function Result({ r }: { r: any }) {
  if (r.png) return html`<img class="result" alt="PNG result" src=${`data:image/png;base64,${r.png}`} />`
  if (r.jpeg) return html`<img class="result" alt="JPEG result" src=${`data:image/jpeg;base64,${r.jpeg}`} />`
  if (r.svg) return html`<img class="result" alt="SVG result" src=${`data:image/svg+xml;base64,${btoa(unescape(encodeURIComponent(r.svg)))}`} />`
  if (r.html) return html`<iframe class="result" sandbox="" referrerpolicy="no-referrer" srcdoc=${r.html}></iframe>`
  if (r.json !== undefined) return html`<pre class="result">${JSON.stringify(r.json, null, 2)}</pre>`
  return html`<pre class="result">${r.text ?? r.markdown ?? ''}</pre>`
}

export function Execution({ x }: { x: any }) {
  return html`<div class="execution" data-id=${x.id}>
    <pre class="code">${x.code}</pre>
    <div class="muted">${x.created_at ? `${new Date(x.created_at).toLocaleTimeString()} · ` : ''}${x.language ? `${x.language} · ` : ''}${x.status}${x.execution_time_ms !== undefined ? ` · ${x.execution_time_ms.toFixed(1)} ms` : ''}${x.error_code ? ` · ${x.error_code}` : ''}${x.cut ? ' · cut to the history\'s bounds' : ''}${x.unkept ? ' · output no longer kept' : ''}</div>
    ${x.stdout && html`<pre class="stdout">${x.stdout}</pre>`}
    ${x.stderr && html`<pre class="stderr">${x.stderr}</pre>`}
    ${(x.results ?? []).map((r: any) => html`<${Result} r=${r} />`)}
    ${x.error && html`<pre class="stderr">${x.error.traceback || `${x.error.name}: ${x.error.value}`}</pre>`}
  </div>`
}
