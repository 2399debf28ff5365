package status

// pageHTML is the status page. Inline CSS only, no JavaScript; html/template
// escapes every value.
const pageHTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{if .RefreshSecs}}<meta http-equiv="refresh" content="{{.RefreshSecs}}">{{end}}
<title>delaybridge{{if .Endpoint}} · {{.Endpoint}}{{end}}</title>
<style>
:root { --fg:#1d2430; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --card:#fff;
        --ok:#12805c; --okbg:#e7f6ef; --warn:#a15c07; --warnbg:#fef3e2; --bad:#b42318; --badbg:#fdecea;
        --bar1:#5b8def; --bar2:#12805c; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--fg); background:var(--bg); }
header { display:flex; align-items:center; gap:12px; padding:14px 24px; background:#1d2430; color:#fff; }
header h1 { font-size:18px; margin:0; font-weight:600; }
header .ep { color:#c8d0dc; font-family:ui-monospace,"DejaVu Sans Mono",monospace; }
header .now { margin-left:auto; color:#c8d0dc; font-size:13px; }
main { padding:18px 24px 32px; max-width:1240px; }
.badge { display:inline-block; padding:2px 9px; border-radius:999px; font-size:12px; font-weight:600; }
.ok { color:var(--ok); background:var(--okbg); } .warn { color:var(--warn); background:var(--warnbg); } .bad { color:var(--bad); background:var(--badbg); }
.grid { display:grid; grid-template-columns:repeat(4, minmax(0,1fr)); gap:14px; margin-bottom:16px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card h2 { margin:0 0 6px; font-size:12px; font-weight:600; text-transform:uppercase; letter-spacing:.05em; color:var(--muted); }
.big { font-size:30px; font-weight:650; font-variant-numeric:tabular-nums; }
.sub { color:var(--muted); font-size:12px; }
.states { list-style:none; margin:0; padding:0; }
.states li { display:flex; justify-content:space-between; padding:3px 0; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; margin-bottom:16px; }
section h2 { margin:0 0 10px; font-size:15px; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; }
td.num, th.num { text-align:right; }
.mono { font-family:ui-monospace,"DejaVu Sans Mono",monospace; font-size:13px; overflow-wrap:anywhere; }
.nowrap { white-space:nowrap; }
.bar { height:8px; border-radius:4px; background:var(--bar1); min-width:1px; }
.bar.d { background:var(--bar2); }
.bars { width:26%; }
.bars div + div { margin-top:3px; }
.problems { margin:0 0 16px; padding:10px 14px; border-radius:10px; }
.err { color:var(--bad); }
footer { color:var(--muted); font-size:12px; }
footer a { color:inherit; }
</style>
</head>
<body>
<header>
  <h1>delaybridge</h1>{{if .Endpoint}}<span class="ep">{{.Endpoint}}</span>{{end}}
  {{if .Healthy}}<span class="badge ok">healthy</span>{{else}}<span class="badge bad">attention</span>{{end}}
  <span class="now">{{.Now}}</span>
</header>
<main>
{{if .Problems}}<div class="problems bad">{{range $i, $p := .Problems}}{{if $i}} · {{end}}{{$p}}{{end}}</div>{{end}}
<div class="grid">
  <div class="card"><h2>Pending</h2>
    {{if .HaveStats}}<div class="big" id="pending">{{.Pending}}</div><div class="sub">messages in the store, leased included</div>
    {{else}}<div class="big">–</div><div class="sub err">{{or .StatsErr "not available"}}</div>{{end}}</div>
  <div class="card"><h2>Leased</h2>
    {{if .HaveStats}}<div class="big" id="leased">{{.Leased}}</div><div class="sub">handed to the dispatcher</div>
    {{else}}<div class="big">–</div>{{end}}</div>
  <div class="card"><h2>Next due</h2>
    {{if .NextDueErr}}<div class="big">–</div><div class="sub err">{{.NextDueErr}}</div>
    {{else if .NextDue}}<div class="big{{if .Overdue}} err{{end}}" style="font-size:22px">{{.NextDue}}</div><div class="sub mono">{{.NextDueAt}}</div>
    {{else}}<div class="big">–</div>{{end}}</div>
  <div class="card"><h2>Broker &amp; breakers</h2>
    <ul class="states">
    {{range .Connections}}<li><span>{{.Name}} connection</span><span class="badge {{if .OK}}ok{{else}}bad{{end}}">{{.State}}</span></li>{{end}}
    {{range .Breakers}}<li><span>{{.Name}} breaker</span><span class="badge {{if .OK}}ok{{else if .Bad}}bad{{else}}warn{{end}}">{{.State}}</span></li>{{end}}
    {{if not (or .Connections .Breakers)}}<li class="sub">not available</li>{{end}}
    </ul></div>
</div>

<section>
  <h2>Throughput and lateness, last {{len .Minutes}} minutes</h2>
  {{if .HaveRates}}
  <table>
    <tr><th>minute</th><th class="num">ingested /min</th><th class="num">dispatched /min</th><th class="num">mean lateness</th><th class="num">dispatch failures /min</th><th class="num">to error queue /min</th><th class="bars"></th></tr>
    {{range .Minutes}}<tr>
      <td>{{.Label}}</td>
      {{if .Known}}<td class="num">{{rate .Ingested}}</td><td class="num">{{rate .Dispatched}}</td>
      <td class="num">{{if .HasLateness}}{{dur .MeanLateness}}{{else}}–{{end}}</td>
      <td class="num">{{rate .Failures}}</td><td class="num">{{rate .ErrorQueued}}</td>
      <td class="bars"><div class="bar" style="width:{{.IngestedBar}}%" title="ingested"></div><div class="bar d" style="width:{{.DispatchedBar}}%" title="dispatched"></div></td>
      {{else}}<td class="num sub" colspan="5">no samples yet</td><td></td>{{end}}
    </tr>{{end}}
    <tr><td><b>since start</b></td><td class="num">{{int .Totals.Ingested}}</td><td class="num">{{int .Totals.Dispatched}}</td>
      <td class="num">{{or .MeanLateness "–"}}</td><td class="num">{{int .Totals.Failures}}</td><td class="num">{{int .Totals.ErrorQueued}}</td><td class="sub">totals; lateness is the mean</td></tr>
  </table>
  <p class="sub">Lateness: from a message's due time to the broker's confirm of its forward. Bars: <span style="color:var(--bar1)">■</span> ingested, <span style="color:var(--bar2)">■</span> dispatched.</p>
  {{else}}<p class="sub">Metrics not available.</p>{{end}}
</section>

<section>
  <h2>Next due messages</h2>
  {{if .RowsErr}}<p class="err">{{.RowsErr}}</p>{{end}}
  {{if .Rows}}
  <table>
    <tr><th>message id</th><th>destination</th><th>due (UTC)</th><th>when</th><th class="num">failed attempts</th><th>state</th></tr>
    {{range .Rows}}<tr>
      <td class="mono">{{.ID}}</td><td class="mono">{{.Destination}}</td><td class="mono nowrap">{{.DueAt}}</td>
      <td class="nowrap{{if .Overdue}} err{{end}}">{{.In}}</td><td class="num">{{.Attempts}}</td>
      <td>{{if .Leased}}<span class="badge warn">leased</span>{{else if .Paused}}<span class="badge warn">paused</span>{{else}}<span class="badge ok">waiting</span>{{end}}{{if .LastError}}<div class="sub">{{.LastError}}</div>{{end}}</td>
    </tr>{{end}}
  </table>
  {{else if not .RowsErr}}<p class="sub">Nothing pending.</p>{{end}}
</section>
<footer>Machine-readable: <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a> · <a href="/debug/vars">/debug/vars</a>{{if .RefreshSecs}} · reloads every {{.RefreshSecs}} s{{end}}</footer>
</main>
</body>
</html>
`
