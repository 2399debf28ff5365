package status

// pageHTML is the status page. Inline CSS only, no JavaScript; html/template
// escapes every value. The actions are plain HTML forms (actions.go).
const pageHTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{if .RefreshSecs}}<meta http-equiv="refresh" content="{{.RefreshSecs}}">{{end}}
<title>delaybridge{{if .Endpoint}} · {{.Endpoint}}{{end}}{{if not .Healthy}} · attention{{end}}</title>
<style>
:root { --fg:#1d2430; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --card:#fff;
        --ok:#12805c; --okbg:#e7f6ef; --warn:#a15c07; --warnbg:#fef3e2; --bad:#b42318; --badbg:#fdecea;
        --bar1:#5b8def; --bar2:#12805c; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--fg); background:var(--bg); }
header { display:flex; align-items:center; gap:12px; padding:14px 24px; background:#1d2430; color:#fff; flex-wrap:wrap; }
header h1 { font-size:18px; margin:0; font-weight:600; }
header .ep { color:#c8d0dc; font-family:ui-monospace,"DejaVu Sans Mono",monospace; }
header .now { margin-left:auto; color:#c8d0dc; font-size:13px; }
header form { display:flex; gap:6px; align-items:center; margin:0; }
header input { padding:3px 6px; border-radius:6px; border:1px solid #48526a; background:#2b3342; color:#fff; }
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
tr.failing td { background:#fff7f6; }
.mono { font-family:ui-monospace,"DejaVu Sans Mono",monospace; font-size:13px; overflow-wrap:anywhere; }
.nowrap { white-space:nowrap; }
.bar { height:8px; border-radius:4px; background:var(--bar1); min-width:1px; }
.bar.d { background:var(--bar2); }
.bars { width:22%; }
.bars div + div { margin-top:3px; }
.problems { margin:0 0 16px; padding:10px 14px; border-radius:10px; }
.problems ul { margin:4px 0 0; padding-left:18px; }
.flash { margin:0 0 16px; padding:10px 14px; border-radius:10px; }
.err { color:var(--bad); }
form.inline { display:inline; margin:0; }
button { font:inherit; font-size:12px; padding:2px 8px; border-radius:6px; border:1px solid var(--line); background:#fff; cursor:pointer; }
button.danger { color:var(--bad); border-color:#f1b8b2; }
.search { display:flex; gap:8px; flex-wrap:wrap; align-items:end; margin-bottom:10px; }
.search label { display:flex; flex-direction:column; font-size:12px; color:var(--muted); }
.search input { padding:4px 6px; border:1px solid var(--line); border-radius:6px; font:inherit; min-width:170px; }
.paging { margin-top:8px; display:flex; gap:14px; }
a { color:#2f5fd0; }
footer { color:var(--muted); font-size:12px; }
footer a { color:inherit; }
</style>
</head>
<body>
<header>
  <h1>delaybridge</h1>{{if .Endpoint}}<span class="ep">{{.Endpoint}}</span>{{end}}
  {{if .Healthy}}<span class="badge ok" id="health">healthy</span>{{else}}<span class="badge bad" id="health">attention</span>{{end}}
  <span class="now">{{.Now}}</span>
  {{if .Session.Enabled}}{{if .Session.LoggedIn}}
  <form method="post" action="/ui/logout"><input type="hidden" name="back" value="{{.Session.Back}}"><span class="sub" style="color:#c8d0dc">actions enabled</span><button type="submit" id="logout">log out</button></form>
  {{else}}
  <form method="post" action="/ui/login" id="login"><input type="hidden" name="back" value="{{.Session.Back}}">
    <input type="password" name="token" placeholder="admin token" autocomplete="current-password" aria-label="admin token" required><button type="submit">log in</button></form>
  {{end}}{{end}}
</header>
<main>
{{if .Session.Flash}}<div class="flash {{if .Session.FlashBad}}bad{{else}}ok{{end}}" id="flash">{{.Session.Flash}}</div>{{end}}
{{if .Problems}}<div class="problems bad" id="problems"><b>Needs attention:</b><ul>
{{range .Problems}}<li><b class="problem">{{.Name}}</b>{{if .Detail}}: {{.Detail}}{{end}}</li>{{end}}
</ul></div>{{end}}
<div class="grid">
  <div class="card"><h2>Pending</h2>
    {{if .HaveStats}}<div class="big" id="pending">{{.Pending}}</div><div class="sub">messages in the store, <span id="leased">{{.Leased}}</span> of them leased</div>
    {{else}}<div class="big">–</div><div class="sub err">{{or .StatsErr "not available"}}</div>{{end}}</div>
  <div class="card"><h2>Next due</h2>
    {{if .NextDueErr}}<div class="big">–</div><div class="sub err">{{.NextDueErr}}</div>
    {{else if .NextDue}}<div class="big{{if .Overdue}} err{{end}}" style="font-size:22px">{{.NextDue}}</div><div class="sub mono">{{.NextDueAt}}</div>
    {{else}}<div class="big">–</div>{{end}}</div>
  <div class="card"><h2>Lateness, last {{.Window}}</h2>
    {{if .Lateness.Known}}<div class="big" style="font-size:22px" id="lateness">p50 {{if .Lateness.Over50}}&gt; {{end}}{{dur .Lateness.P50}} · p99 {{if .Lateness.Over99}}&gt; {{end}}{{dur .Lateness.P99}}</div>
    <div class="sub">{{int .Lateness.Count}} forwards, each from when it could go to the broker's confirm</div>
    {{else}}<div class="big">–</div><div class="sub">no forwards in the window</div>{{end}}</div>
  <div class="card"><h2>Broker &amp; breakers</h2>
    <ul class="states">
    {{range .Connections}}<li><span>{{.Name}} connection</span><span class="badge {{if .OK}}ok{{else}}bad{{end}}">{{.State}}</span></li>{{end}}
    {{range .Breakers}}<li><span>{{.Name}} breaker</span><span class="badge {{if .OK}}ok{{else if .Bad}}bad{{else}}warn{{end}}">{{.State}}</span></li>{{end}}
    {{if not (or .Connections .Breakers)}}<li class="sub">not available</li>{{end}}
    </ul></div>
</div>

<section id="destinations">
  <h2>Destinations, last {{.Window}}</h2>
  {{if .Destinations}}
  <table>
    <tr><th>destination</th><th class="num">pending</th><th class="num">due in the next minute</th><th class="num">failures</th><th class="num">failures /min</th><th class="num">dispatched</th><th class="num">dispatched /min</th><th>state</th></tr>
    {{range .Destinations}}<tr{{if .Failing}} class="failing"{{end}}>
      <td class="{{if not .Overflow}}mono{{else}}sub{{end}}">{{.Name}}</td>
      <td class="num">{{if .HaveCounts}}{{int .Pending}}{{else}}–{{end}}</td><td class="num">{{if .HaveCounts}}{{int .DueSoon}}{{else}}–{{end}}</td>
      <td class="num{{if .Failures}} err{{end}}">{{int .Failures}}</td><td class="num">{{rate .FailureRate}}</td>
      <td class="num">{{int .Dispatched}}</td><td class="num">{{rate .DispatchedRate}}</td>
      <td>{{if .Failing}}<span class="badge bad">failing</span>{{else if .Failures}}<span class="badge warn">some failures</span>{{else}}<span class="badge ok">ok</span>{{end}}</td>
    </tr>{{end}}
  </table>
  <p class="sub">From the per-destination metrics: counts refresh every 15 s; like the metrics, at most DELAYBRIDGE_METRICS_MAX_DESTINATIONS destinations have a row of their own{{if .DestCapped}}, the others are summed{{end}}. Failing: failures and fewer forwards than failures in the window.</p>
  {{else}}<p class="sub">{{if .HaveRates}}No destination has pending messages or forwards.{{else}}Metrics not available.{{end}}</p>{{end}}
</section>

<section id="errors">
  <h2>Error queue</h2>
  {{if .ErrorsErr}}<p class="err">The error queue: {{.ErrorsErr}}</p>
  {{else if .HaveErrorQueue}}
  <p><span class="big" style="font-size:22px" id="error-depth">{{if .ErrorQueue.Partial}}≥ {{end}}{{.ErrorQueue.Depth}}</span> <span class="sub">copies of this endpoint's messages (read at {{.ErrorsAt}} UTC, at most every 30 s{{if .ErrorQueue.Partial}}; the read stopped before the end of the queue{{end}})</span></p>
  {{if .ErrorsShown}}
  <table>
    <tr><th>message id</th><th>destination</th><th>stage</th><th>reason</th><th>failed at (UTC)</th><th></th></tr>
    {{range .ErrorsShown}}<tr>
      <td class="mono">{{.ID}}</td><td class="mono">{{.Destination}}</td><td>{{.Stage}}</td><td>{{.Reason}}</td>
      <td class="mono nowrap">{{if not .FailedAt.IsZero}}{{.FailedAt.UTC.Format "2006-01-02 15:04:05"}}{{end}}</td>
      <td>{{if and $.Session.LoggedIn .ID}}<form class="inline" method="post" action="/ui/errors/{{path .ID}}/replay"><input type="hidden" name="csrf" value="{{$.Session.CSRF}}"><input type="hidden" name="back" value="{{$.Session.Back}}"><button type="submit" class="replay">retry</button></form>{{end}}</td>
    </tr>{{end}}
  </table>
  {{if .MoreErrors}}<p><a href="{{.MoreErrors}}">show up to 100 newest copies</a></p>{{end}}
  {{end}}
  <p class="sub">Newest first. The admin API lists, shows, deletes and replays them: <span class="mono">GET /api/v1/errors</span>.</p>
  {{else}}<p class="sub">Not available.</p>{{end}}
</section>

<section id="pending-list">
  <h2 id="pending">Pending messages</h2>
  {{if .HaveSearch}}
  <form class="search" method="get" action="/#pending">
    <label>id or id prefix<input type="text" name="id_prefix" value="{{.Search.IDPrefix}}"></label>
    <label>destination queue<input type="text" name="destination" value="{{.Search.Destination}}"></label>
    <label>or exchange<input type="text" name="exchange" value="{{.Search.Exchange}}"></label>
    <label>routing key<input type="text" name="routing_key" value="{{.Search.RoutingKey}}" style="min-width:120px"></label>
    <label>due from (RFC 3339)<input type="text" name="due_from" value="{{.Search.DueFrom}}" placeholder="2026-11-21T20:00:00Z"></label>
    <label>due before<input type="text" name="due_to" value="{{.Search.DueTo}}" placeholder="2026-11-22T00:00:00Z"></label>
    <button type="submit" id="search">search</button>{{if .Search.Active}} <a href="/">clear</a>{{end}}
  </form>
  {{if .Search.Err}}<p class="err">{{.Search.Err}}</p>{{end}}
  {{end}}
  {{if .RowsErr}}<p class="err">{{.RowsErr}}</p>{{end}}
  {{if .Rows}}
  <table id="rows">
    <tr><th>message id</th><th>destination</th><th>due (UTC)</th><th>when</th><th class="num">failed attempts</th><th>state</th>{{if .Session.LoggedIn}}<th></th>{{end}}</tr>
    {{range .Rows}}<tr>
      <td class="mono msgid">{{.ID}}{{if .Send}} <span class="sub">(send {{.Send}})</span>{{end}}</td><td class="mono">{{.Destination}}</td><td class="mono nowrap">{{.DueAt}}</td>
      <td class="nowrap{{if .Overdue}} err{{end}}">{{.In}}</td><td class="num">{{.Attempts}}</td>
      <td><span class="badge {{.Class}}">{{.State}}</span>{{if .LastError}}<div class="sub">{{.LastError}}</div>{{end}}</td>
      {{if $.Session.LoggedIn}}<td class="nowrap">
        <form class="inline" method="post" action="/ui/timeouts/{{path .ID}}/dispatch"><input type="hidden" name="csrf" value="{{$.Session.CSRF}}"><input type="hidden" name="back" value="{{$.Session.Back}}"><button type="submit" class="dispatch">dispatch now</button></form>
        <form class="inline" method="post" action="/ui/timeouts/{{path .ID}}/cancel"><input type="hidden" name="csrf" value="{{$.Session.CSRF}}"><input type="hidden" name="back" value="{{$.Session.Back}}"><button type="submit" class="danger cancel">cancel</button></form>
      </td>{{end}}
    </tr>{{end}}
  </table>
  <div class="paging">{{if .FirstPage}}<a href="{{.FirstPage}}">first page</a>{{end}}{{if .NextPage}}<a href="{{.NextPage}}" id="next-page">next page</a>{{end}}</div>
  {{else if not .RowsErr}}<p class="sub">{{if .Search.Active}}No pending message matches.{{else}}Nothing pending.{{end}}</p>{{end}}
  {{if and .Session.Enabled (not .Session.LoggedIn)}}<p class="sub">Log in with the admin token (top right) to cancel or dispatch messages and retry error copies from here.</p>{{end}}
  {{if not .Session.Enabled}}<p class="sub">Actions are off: set DELAYBRIDGE_ADMIN_TOKEN to enable them and the admin API.</p>{{end}}
</section>

{{if .HaveSchedules}}<section id="schedules">
  <h2>Recurring schedules</h2>
  {{if .SchedulesErr}}<p class="err">{{.SchedulesErr}}</p>{{else if .Schedules}}
  <table id="schedule-rows">
    <tr><th>schedule</th><th>state</th><th>next fire (UTC)</th><th>when</th><th>cron</th><th>time zone</th><th>destination</th><th class="num">fires</th><th class="num">misfires</th></tr>
    {{range .Schedules}}<tr>
      <td class="mono msgid">{{.Key}}</td><td><span class="badge {{.Class}}">{{.State}}</span>{{if .LastError}}<div class="sub">{{.LastError}}</div>{{end}}</td>
      <td class="mono nowrap">{{or .NextFire "–"}}</td><td class="nowrap{{if .Late}} err{{end}}">{{.In}}</td>
      <td class="mono">{{.Cron}}</td><td class="mono">{{.Zone}}</td><td class="mono">{{.Destination}}</td>
      <td class="num">{{.Fires}}</td><td class="num">{{.Misfires}}</td>
    </tr>{{end}}
  </table>
  {{if .SchedulesMore}}<p class="sub">{{.SchedulesMore}}: <span class="mono">delaybridge schedules</span> lists them all.</p>{{end}}
  {{else}}<p class="sub">No recurring schedules.</p>{{end}}
  <p class="sub">Show, pause, resume, cancel or fire one now: <span class="mono">delaybridge schedules</span>, or the admin API's <span class="mono">/api/v1/schedules</span>.</p>
</section>{{end}}

<section>
  <h2>Throughput and lateness by minute</h2>
  {{if .HaveRates}}
  <table>
    <tr><th>minute</th><th class="num">ingested /min</th><th class="num">dispatched /min</th><th class="num">lateness p50</th><th class="num">lateness p99</th><th class="num">dispatch failures /min</th><th class="num">to error queue /min</th><th class="num">not stored /min</th><th class="bars"></th></tr>
    {{range .Minutes}}<tr>
      <td>{{.Label}}</td>
      {{if .Known}}<td class="num">{{rate .Ingested}}</td><td class="num">{{rate .Dispatched}}</td>
      <td class="num">{{if .Lateness.Known}}{{if .Lateness.Over50}}&gt; {{end}}{{dur .Lateness.P50}}{{else}}–{{end}}</td>
      <td class="num">{{if .Lateness.Known}}{{if .Lateness.Over99}}&gt; {{end}}{{dur .Lateness.P99}}{{else}}–{{end}}</td>
      <td class="num">{{rate .Failures}}</td><td class="num">{{rate .ErrorQueued}}</td><td class="num">{{rate .Dropped}}</td>
      <td class="bars"><div class="bar" style="width:{{.IngestedBar}}%" title="ingested"></div><div class="bar d" style="width:{{.DispatchedBar}}%" title="dispatched"></div></td>
      {{else}}<td class="num sub" colspan="7">no samples yet</td><td></td>{{end}}
    </tr>{{end}}
    <tr><td><b>since start</b></td><td class="num">{{int .Totals.Ingested}}</td><td class="num">{{int .Totals.Dispatched}}</td>
      <td></td><td></td><td class="num">{{int .Totals.Failures}}</td><td class="num">{{int .Totals.ErrorQueued}}</td><td class="num">{{int .Totals.Dropped}}</td><td class="sub">totals</td></tr>
  </table>
  <p class="sub">Not stored: messages taken in that will not be delivered, since start by reason:{{range $i, $d := .DroppedBy}}{{if $i}},{{end}} {{$d.Reason}} {{int $d.Count}}{{end}}. Duplicate: a redelivery of a send that is pending (that send is delivered); cancelled: its id was cancelled within the cancel window; replaced: a later message of its MassTransit token replaced it. The log has a warning for each reason, summed up every 10 s.</p>
  <p class="sub">Lateness percentiles from the delaybridge_lateness_seconds histogram (buckets up to 60 s). Bars: <span style="color:var(--bar1)">■</span> ingested, <span style="color:var(--bar2)">■</span> dispatched.</p>
  {{else}}<p class="sub">Metrics not available.</p>{{end}}
</section>

<section id="instance">
  <h2>Instance</h2>
  <table>
    <tr><th>owner</th><td class="mono">{{or .Instance.Owner "–"}}</td><th>host</th><td class="mono">{{or .Instance.Hostname "–"}}</td></tr>
    <tr><th>version</th><td class="mono">{{or .Instance.Version "unknown"}}</td><th>revision</th><td class="mono">{{or .Instance.Revision "unknown"}}</td></tr>
    <tr><th>uptime</th><td id="uptime">{{or .Instance.Uptime "–"}}</td><th>started</th><td class="mono">{{.Instance.Started}}</td></tr>
  </table>
</section>
<footer>{{if not .RefreshSecs}}<a href="{{.Session.Back}}">reload</a> · {{end}}Machine-readable: <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a> · <a href="/debug/vars">/debug/vars</a>{{if .RefreshSecs}} · reloads every {{.RefreshSecs}} s{{end}}</footer>
</main>
</body>
</html>
`
