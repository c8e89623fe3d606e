/**
 * The left sidebar panel "GPU budget": this session, its project chain with a usage chart,
 * my other work (with cancel and logs), and notices.
 */
import { Dialog, ReactWidget, showDialog, Notification } from '@jupyterlab/apputils';
import React from 'react';

import type {
  IAccount,
  IEndedWorkload,
  IJobLog,
  IRestoreReport,
  ISnapshotSet,
  IWorkload
} from './api';
import {
  describePlacement,
  formatClock,
  formatDuration,
  formatFraction,
  formatGpuHours,
  formatRelative,
  formatWhen,
  formatWindow,
  formatZone,
  clusterName,
  placementFraction,
  placementWhere,
  sliceName,
  spokenDuration,
  standingWords
} from './format';
import { historyView } from './history';
import { MyWeekSection } from './myweek';
import { BudgetModel } from './model';
import { noticeBody, noticeDetails, noticeTitle } from './notices';
import { forecastText } from './preemption';
import {
  formatBytes,
  kernelWhere,
  methodWords,
  restoredWords,
  restoreLostSomething,
  snapshotLine,
  unsavedWords
} from './snapshots';
import {
  costSoFar,
  grantLeft,
  ISettings,
  ISnapshot,
  sessionView,
  toLocalMs
} from './state';

interface IProps {
  model: BudgetModel;
  settings: ISettings;
  now: number;
}

function Section(props: { title: string; id: string; children: React.ReactNode }) {
  return (
    <section className="jp-GpuBudget-section" aria-labelledby={props.id}>
      <h3 id={props.id} className="jp-GpuBudget-sectionTitle">
        {props.title}
      </h3>
      {props.children}
    </section>
  );
}

function Row(props: { label: string; children: React.ReactNode; title?: string }) {
  return (
    <div className="jp-GpuBudget-row" title={props.title}>
      <dt>{props.label}</dt>
      <dd>{props.children}</dd>
    </div>
  );
}

function Meter(props: { fraction: number; level: string; label: string }) {
  const pct = Math.max(0, Math.min(100, props.fraction * 100));
  return (
    <div
      className={`jp-GpuBudget-meter jp-GpuBudget-${props.level}`}
      role="meter"
      aria-label={props.label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={Math.round(pct)}
    >
      <div className="jp-GpuBudget-meterFill" style={{ width: `${pct}%` }} />
    </div>
  );
}

// ------------------------------------------------------------------ this session
function SessionSection(props: IProps) {
  const snap = props.model.snapshot;
  const s = snap.session;
  const now = props.now;
  const v = sessionView(snap, now, props.settings);
  if (!s) {
    return (
      <Section title="This session" id="jp-GpuBudget-session">
        <p className="jp-GpuBudget-muted">
          This JupyterLab was not started through the GPU queue, so it has no GPU session of its
          own. Your projects and other work are shown below.
        </p>
      </Section>
    );
  }
  const fraction = placementFraction(s.placement);
  const inventory =
    s.inventory === 'declared' ? 'declared inventory (demo or test): no real GPU behind it' : '';
  const started = s.started_at !== null ? toLocalMs(s.started_at, snap.offsetMs) : null;
  const forecast = forecastText(snap, now); // the service's outlook, while it is likely
  let protection: React.ReactNode;
  switch (v.phase) {
    case 'protected':
    case 'ending':
      protection = (
        <div className={`jp-GpuBudget-countdown jp-GpuBudget-${v.phase === 'ending' ? 'warn' : 'ok'}`}>
          <div className="jp-GpuBudget-big" role="timer" aria-label="protected time left">
            {formatDuration(v.protectedLeft, true)}
          </div>
          <div>
            protected time left, until {formatClock(v.protectedUntil!, now)}. Until then this
            session cannot be preempted.
          </div>
        </div>
      );
      break;
    case 'unprotected':
      protection = (
        <div className="jp-GpuBudget-countdown jp-GpuBudget-danger">
          <div className="jp-GpuBudget-big">unprotected</div>
          <div>
            May be preempted when backed work needs this slice ({v.why}). Save your work
            regularly.
          </div>
        </div>
      );
      break;
    case 'preempting':
      protection = (
        <div className="jp-GpuBudget-countdown jp-GpuBudget-danger" role="alert">
          <div className="jp-GpuBudget-big">being preempted</div>
          <div>
            {s.preempt_requested}.{' '}
            {typeof (s.preempt_stop_at ?? s.preempt_deadline) === 'number'
              ? `This server will be stopped ${formatRelative(
                  (toLocalMs((s.preempt_stop_at ?? s.preempt_deadline)!, snap.offsetMs) - now) /
                    1000
                )}.`
              : 'This server will be stopped shortly.'}{' '}
            {snap.info?.features.snapshots && snap.server?.enabled
              ? 'Its kernels are being saved first: the session is queued again and they ' +
                'are restored when it starts. Save your notebooks.'
              : 'Save your work now.'}
          </div>
        </div>
      );
      break;
    case 'queued':
      protection = (
        <div className="jp-GpuBudget-countdown jp-GpuBudget-neutral">
          <div className="jp-GpuBudget-big">queued</div>
          <div>
            {s.queue_position ? `Position ${s.queue_position} in the queue. ` : ''}
            {s.predicted_start
              ? `Predicted start ${formatWhen(toLocalMs(s.predicted_start, snap.offsetMs), now)}.`
              : ''}
          </div>
        </div>
      );
      break;
    default:
      protection = <p>This session is {s.state}.</p>;
  }
  return (
    <Section title="This session" id="jp-GpuBudget-session">
      {protection}
      {forecast && (
        <p className="jp-GpuBudget-forecast jp-GpuBudget-warn" role="status">
          {forecast}
        </p>
      )}
      <dl className="jp-GpuBudget-rows">
        <Row label="Project">{s.project}</Row>
        <Row label="Slice" title="What this session was given">
          {s.placement
            ? `${sliceName(s.placement)} (${formatFraction(fraction, s.placement)})`
            : 'not placed yet'}
        </Row>
        {clusterName(s.cluster) && (
          <Row label="Cluster" title="The cluster this session runs on (or waits for)">
            {clusterName(s.cluster)}
          </Row>
        )}
        <Row label="Runs on">
          {s.placement ? placementWhere(s.placement) : '–'}
          {inventory && <div className="jp-GpuBudget-muted">{inventory}</div>}
        </Row>
        {started !== null && (
          <Row label="Started">{`${formatClock(started, now)} (${formatRelative((started - now) / 1000)})`}</Row>
        )}
        <Row
          label="Cost so far"
          title="GPU-hours charged to the project: slice fraction × time running"
        >
          {formatGpuHours(v.cost)}
          {fraction > 0 && started !== null && (
            <span className="jp-GpuBudget-muted">
              {' '}
              ({formatFraction(fraction, s.placement)} × {spokenDuration((now - started) / 1000)})
            </span>
          )}
        </Row>
        <Row label="Backed" title="Backed: the project's grant covers this session's protected time">
          {!s.backed
            ? 'no: unbacked, preempted first'
            : v.phase === 'unprotected'
              ? `the grant covers it, but it is not protected now (${v.why})`
              : 'yes: the grant covers its protected time'}
        </Row>
      </dl>
    </Section>
  );
}

// ------------------------------------------------------------------ budget
function AccountCard(props: { a: IAccount; settings: ISettings; window: number | null }) {
  const a = props.a;
  const g = grantLeft(a, props.settings);
  const level = g.usedPct === null ? 'neutral' : g.low ? 'danger' : g.usedPct > 75 ? 'warn' : 'ok';
  return (
    <div className="jp-GpuBudget-account">
      <div className="jp-GpuBudget-accountName">
        {a.name}{' '}
        <span className="jp-GpuBudget-muted">{a.project ? 'project' : 'program'}</span>
      </div>
      {g.usedPct !== null && (
        <Meter
          fraction={g.usedPct / 100}
          level={level}
          label={`${a.name}: ${Math.round(g.usedPct)}% of its grant used`}
        />
      )}
      <dl className="jp-GpuBudget-rows">
        <Row label="Grant">
          {formatGpuHours(a.effective_grant_hours)}
          {props.window ? ` / ${formatWindow(props.window)}` : ''}
          {a.grant?.share_pct !== null && a.grant?.share_pct !== undefined
            ? ` (${a.grant.share_pct}% share)`
            : ''}
        </Row>
        <Row label="Used">
          {formatGpuHours(a.usage_hours)}
          {g.usedPct !== null ? ` (${Math.round(g.usedPct)}%)` : ''}
        </Row>
        <Row label="Left">{formatGpuHours(g.left === null ? null : Math.max(0, g.left))}</Row>
        <Row label="Standing" title="used ÷ grant: the lower, the sooner its work starts">
          {a.standing === null ? '–' : `${a.standing.toFixed(2)} · `}
          {standingWords(a.standing)}
        </Row>
        {a.my_limit?.text && (
          <Row
            label="Your limit"
            title="what the project backs of your own work (GPU-hours per window, GPUs at once): past it, your work still runs but unbacked, so it may be preempted"
          >
            {a.my_limit.text}
          </Row>
        )}
      </dl>
    </div>
  );
}

function DailyChart(props: { snap: ISnapshot; now: number }) {
  const daily = props.snap.daily;
  if (!daily || !daily.days.length) {
    return null;
  }
  const max = Math.max(...daily.days.map(d => d.gpu_hours), 0.01);
  const w = 240;
  const h = 64;
  const top = 11; // room for the values above the bars
  const bw = w / daily.days.length;
  const label = daily.days.map(d => `${d.date} ${formatGpuHours(d.gpu_hours)}`).join(', ');
  const short = (x: number) => (x >= 10 ? x.toFixed(0) : x >= 0.05 ? x.toFixed(1) : '');
  return (
    <figure className="jp-GpuBudget-chart">
      <svg viewBox={`0 0 ${w} ${top + h + 16}`} role="img" aria-label={`Usage per day: ${label}`}>
        {daily.days.map((d, i) => {
          const bh = (d.gpu_hours / max) * h;
          const day = new Date(toLocalMs(d.start, props.snap.offsetMs));
          const last = i === daily.days.length - 1;
          return (
            <g key={d.date}>
              <rect
                x={i * bw + 2}
                y={top + h - bh}
                width={Math.max(1, bw - 4)}
                height={bh}
                className="jp-GpuBudget-bar"
              >
                <title>{`${d.date}: ${formatGpuHours(d.gpu_hours)}`}</title>
              </rect>
              <text x={i * bw + bw / 2} y={top + h - bh - 2} textAnchor="middle" className="jp-GpuBudget-axis">
                {short(d.gpu_hours)}
              </text>
              <text x={i * bw + bw / 2} y={top + h + 11} textAnchor="middle" className="jp-GpuBudget-axis">
                {last ? 'today' : day.toLocaleDateString(undefined, { weekday: 'short' }).slice(0, 2) + ' ' + day.getDate()}
              </text>
            </g>
          );
        })}
      </svg>
      <figcaption className="jp-GpuBudget-muted">
        {daily.account}: GPU-hours used per day over the last {formatWindow(daily.window_s)}, your local days
      </figcaption>
    </figure>
  );
}

function BudgetSection(props: IProps) {
  const snap = props.model.snapshot;
  if (!snap.chain.length) {
    return null;
  }
  const window = snap.usage?.window_s ?? null;
  return (
    <Section title="Budget" id="jp-GpuBudget-budget">
      <p className="jp-GpuBudget-muted">
        GPU-hours per {window ? formatWindow(window) : 'window'} (a whole GPU for an hour is 1
        GPU-h; a slice counts its share). Standing = used ÷ grant: lower standing starts first.
        Over its grant, new work is unbacked: never protected, preempted first.
      </p>
      <DailyChart snap={snap} now={props.now} />
      {snap.chain.map(a => (
        <AccountCard key={a.name} a={a} settings={props.settings} window={window} />
      ))}
    </Section>
  );
}

// ------------------------------------------------------------------ my other work
function LogView(props: { model: BudgetModel; id: string }) {
  const [log, setLog] = React.useState<IJobLog | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const load = React.useCallback(() => {
    props.model.api
      .jobLog(props.id)
      .then(l => {
        setLog(l);
        setError(l ? null : 'this service does not serve job logs');
      })
      .catch(e => setError(String(e.message ?? e)));
  }, [props.id]);
  React.useEffect(load, [load]);
  return (
    <div className="jp-GpuBudget-log">
      {error && <div className="jp-GpuBudget-error">{error}</div>}
      {log && (
        <pre tabIndex={0} aria-label={`log of ${props.id}`}>
          {log.truncated ? `… (earlier output left out: gpubudget logs ${props.id} prints all of it)\n` : ''}
          {log.text || '(empty so far)'}
        </pre>
      )}
      <button className="jp-GpuBudget-link" onClick={load}>
        Reload log
      </button>
    </div>
  );
}

function WorkItem(props: IProps & { w: IWorkload }) {
  const { w, model, now } = props;
  const snap = model.snapshot;
  const [showLog, setShowLog] = React.useState(false);
  const [busy, setBusy] = React.useState(false);
  const isSession = w.kind === 'interactive';
  const canCancel = w.state === 'pending' || (!isSession && w.state === 'running');
  const canLog = !isSession && !!snap.info?.features.job_log;
  const title = w.name || w.id;
  const cancel = async () => {
    const running = w.state === 'running';
    const result = await showDialog({
      title: isSession ? 'Leave the queue?' : running ? 'Stop this job?' : 'Cancel this job?',
      body: running
        ? `Job ${title} (${w.project}) will be stopped. The GPU time it used so far stays charged.`
        : `${isSession ? 'Session' : 'Job'} ${title} (${w.project}) will leave the queue. ` +
          'Nothing has been charged for it.',
      buttons: [Dialog.cancelButton({ label: 'Keep it' }), Dialog.warnButton({ label: isSession ? 'Leave queue' : running ? 'Stop job' : 'Cancel job' })]
    });
    if (!result.button.accept) {
      return;
    }
    setBusy(true);
    try {
      if (isSession) {
        await model.api.cancelSession(w.id);
      } else {
        await model.api.cancelJob(w.id);
      }
      Notification.success(`${isSession ? 'Session' : 'Job'} ${title} cancelled.`, { autoClose: 4000 });
    } catch (e: any) {
      Notification.error(`Could not cancel ${title}: ${e?.message ?? e}`);
    } finally {
      setBusy(false);
      void model.refresh();
    }
  };
  let detail: string;
  if (w.state === 'pending') {
    const pos = w.queue_position ? `#${w.queue_position} in the queue` : 'in the queue';
    const start = w.predicted_start
      ? `, predicted start ${formatWhen(toLocalMs(w.predicted_start, snap.offsetMs), now)}`
      : ', no predicted start yet';
    detail = pos + start;
  } else {
    const started = w.started_at !== null ? toLocalMs(w.started_at, snap.offsetMs) : null;
    const protectedLeft =
      w.protected_left_s !== null ? Math.max(0, w.protected_left_s - (now - snap.receivedAt) / 1000) : 0;
    detail =
      (started !== null ? `started ${formatClock(started, now)}` : 'running') +
      (protectedLeft >= 1 ? `, protected ${spokenDuration(protectedLeft)} more` : ', unprotected') +
      `, ${formatGpuHours(costSoFar(w, snap, now))} so far`;
  }
  return (
    <li className="jp-GpuBudget-work">
      <div className="jp-GpuBudget-workHead">
        <span className={`jp-GpuBudget-state jp-GpuBudget-state-${w.state}`}>{w.state}</span>{' '}
        <strong>{title}</strong>{' '}
        <span className="jp-GpuBudget-muted">
          {isSession ? 'session' : `${w.kind} job`} · {w.project}
          {clusterName(w.cluster) ? ` · cluster ${clusterName(w.cluster)}` : ''}
          {w.placement ? ` · ${describePlacement(w.placement)}` : ''}
        </span>
      </div>
      <div className="jp-GpuBudget-muted">{detail}</div>
      <div className="jp-GpuBudget-actions">
        {canCancel && (
          <button
            className="jp-GpuBudget-button jp-mod-warn"
            onClick={() => void cancel()}
            disabled={busy}
            aria-label={`${isSession ? 'Leave the queue' : w.state === 'running' ? 'Stop job' : 'Cancel job'} ${title}`}
          >
            {isSession ? 'Leave queue' : w.state === 'running' ? 'Stop' : 'Cancel'}
          </button>
        )}
        {canLog && (
          <button
            className="jp-GpuBudget-button"
            onClick={() => setShowLog(!showLog)}
            aria-expanded={showLog}
          >
            {showLog ? 'Hide log' : 'Log'}
          </button>
        )}
      </div>
      {showLog && <LogView model={model} id={w.id} />}
    </li>
  );
}

function WorkSection(props: IProps) {
  const work = props.model.snapshot.work;
  return (
    <Section title="My other work" id="jp-GpuBudget-work">
      {work.length ? (
        <ul className="jp-GpuBudget-workList">
          {work.map(w => (
            <WorkItem key={w.id} {...props} w={w} />
          ))}
        </ul>
      ) : (
        <p className="jp-GpuBudget-muted">No other sessions or batch jobs running or queued.</p>
      )}
    </Section>
  );
}

/** One ended session or job: when, for how long, on what, and what it cost which project. */
function EndedItem(props: { w: IEndedWorkload; offsetMs: number; now: number }) {
  const { w, now } = props;
  const fraction = placementFraction(w.placement);
  const ended = w.ended_at !== null ? toLocalMs(w.ended_at, props.offsetMs) : null;
  // a hub session is named "<user>/<server>": the default server is just "GPU session"
  const server = w.kind === 'interactive' && /^[^/]+\/(.*)$/.exec(w.name ?? '');
  const title = server ? (server[1] ? `GPU session ${server[1]}` : 'GPU session') : w.name || w.id;
  return (
    <li className="jp-GpuBudget-endedItem" data-workload={w.id}>
      <div className="jp-GpuBudget-workHead">
        <span className={`jp-GpuBudget-state jp-GpuBudget-state-${w.state}`}>{w.state}</span>{' '}
        <strong>{title}</strong>{' '}
        <span className="jp-GpuBudget-muted">
          {w.kind === 'interactive' ? 'session' : `${w.kind} job`} · {w.project}
          {clusterName(w.cluster) ? ` · cluster ${clusterName(w.cluster)}` : ''}
        </span>
      </div>
      <div>
        <strong>{formatGpuHours(w.charged_gpu_hours)}</strong> charged to {w.project}
        <span className="jp-GpuBudget-muted">
          {' '}
          ({spokenDuration(w.ran_s)} on {fraction > 0 ? formatFraction(fraction, w.placement) : 'no GPU'}
          {ended !== null ? `, ended ${formatClock(ended, now)}` : ''})
        </span>
      </div>
    </li>
  );
}

function EndedSection(props: IProps) {
  const snap = props.model.snapshot;
  const ended = snap.ended;
  if (!ended || !ended.length) {
    return null;
  }
  return (
    <Section title="Recently ended" id="jp-GpuBudget-ended">
      <p className="jp-GpuBudget-muted">
        What your last sessions and jobs cost: slice share × time running, charged to their project.
      </p>
      <ul className="jp-GpuBudget-ended">
        {ended.map(w => (
          <EndedItem key={w.id} w={w} offsetMs={snap.offsetMs} now={props.now} />
        ))}
      </ul>
    </Section>
  );
}

// ------------------------------------------------------------------ history
function HistorySection(props: IProps) {
  const snap = props.model.snapshot;
  const h = snap.history;
  if (!h || !h.segments.length) {
    return null;
  }
  const v = historyView(h, snap.offsetMs, props.now);
  return (
    <Section title="This server's history" id="jp-GpuBudget-history">
      <div className="jp-GpuBudget-history">
        <p className="jp-GpuBudget-history-summary">{v.summary}</p>
        <dl>
          {v.segments.map((g, i) => (
            <React.Fragment key={`${h.segments[i].workload}:${h.segments[i].start}`}>
              <dt>{g.label}</dt>
              <dd>{g.cost}</dd>
            </React.Fragment>
          ))}
          <dt>
            <strong>Total</strong>
          </dt>
          <dd>
            <strong>{v.total}</strong>
          </dd>
        </dl>
      </div>
    </Section>
  );
}

// ------------------------------------------------------------------ notices
function NoticesSection(props: IProps) {
  const snap = props.model.snapshot;
  const items = snap.notices.slice(0, 5);
  if (!items.length) {
    return null;
  }
  return (
    <Section title="Notices" id="jp-GpuBudget-notices">
      <ul className="jp-GpuBudget-notices" aria-live="polite">
        {items.map(n => (
          <li key={`${n.kind}:${n.workload}:${n.at}`} className={`jp-GpuBudget-notice-${n.kind}`}>
            <div>
              <span className="jp-GpuBudget-muted">
                {formatClock(toLocalMs(n.at, snap.offsetMs), props.now)}
              </span>{' '}
              <strong className="jp-GpuBudget-notice-title">{noticeTitle(n)}</strong>
            </div>
            {noticeBody(n) ? <div className="jp-GpuBudget-notice-body">{noticeBody(n)}</div> : null}
            {noticeDetails(n).length ? (
              <details className="jp-GpuBudget-notice-details">
                <summary>details</summary>
                <dl>
                  {noticeDetails(n).map(([k, v]) => (
                    <React.Fragment key={k}>
                      <dt>{k}</dt>
                      <dd>
                        <code>{v}</code>
                      </dd>
                    </React.Fragment>
                  ))}
                </dl>
              </details>
            ) : null}
          </li>
        ))}
      </ul>
    </Section>
  );
}

// ------------------------------------------------------------------ snapshots
function RestoredView(props: { r: IRestoreReport; now: number; offsetMs: number }) {
  const r = props.r;
  const lost = restoreLostSomething(r);
  return (
    <div
      className={`jp-GpuBudget-restored jp-GpuBudget-${lost ? 'warn' : 'ok'}`}
      role="status"
      aria-label="what the restore brought back"
    >
      <div>
        <strong>Restored</strong>{' '}
        {formatClock(toLocalMs(r.at, props.offsetMs), props.now)}
        {r.taken_at !== null && r.taken_at !== undefined
          ? ` from the snapshot taken ${formatClock(toLocalMs(r.taken_at, props.offsetMs), props.now)}`
          : ''}
        {r.error && !r.kernels.length ? `: nothing restored (${r.error})` : ':'}
      </div>
      {r.skipped?.length ? (
        <div className="jp-GpuBudget-muted">
          The newest snapshot failed verification and was not used ({r.skipped[0].problem}).
        </div>
      ) : null}
      <ul className="jp-GpuBudget-restoredList">
        {r.kernels.map((k, i) => (
          <li key={i}>
            <span className="jp-GpuBudget-mono">{kernelWhere(k)}</span>: {restoredWords(k)}
            {Object.keys(k.lost ?? {}).length > 0 && (
              <ul className="jp-GpuBudget-lost">
                {Object.entries(k.lost).map(([name, why]) => (
                  <li key={name}>
                    <span className="jp-GpuBudget-mono">{name}</span> — {why}
                  </li>
                ))}
              </ul>
            )}
          </li>
        ))}
      </ul>
    </div>
  );
}

function SnapshotItem(props: IProps & { s: ISnapshotSet; busy: boolean; onRestore: () => void }) {
  const { s, model, now } = props;
  const snap = model.snapshot;
  const unsaved = unsavedWords(s);
  return (
    <li className={`jp-GpuBudget-snapshot jp-GpuBudget-snapshot-${s.status}`}>
      <div>
        {snapshotLine(s, now, snap.offsetMs)}
        {s.status !== 'ok' && (
          <span className="jp-GpuBudget-state jp-GpuBudget-state-failed"> {s.status}</span>
        )}
      </div>
      {s.problem && <div className="jp-GpuBudget-muted">{s.problem}</div>}
      {unsaved.length > 0 && (
        <div className="jp-GpuBudget-muted" title={unsaved.join('\n')}>
          not saveable: {unsaved.slice(0, 3).join('; ')}
          {unsaved.length > 3 ? ` and ${unsaved.length - 3} more` : ''}
        </div>
      )}
      {s.status === 'ok' && (
        <button
          className="jp-GpuBudget-button"
          disabled={props.busy || !snap.server?.enabled}
          onClick={props.onRestore}
          aria-label={`Restore the snapshot of ${formatClock(toLocalMs(s.created_at, snap.offsetMs), now)}`}
        >
          Restore
        </button>
      )}
    </li>
  );
}

function SnapshotSection(props: IProps) {
  const snap = props.model.snapshot;
  const s = snap.session;
  const [busy, setBusy] = React.useState<string | null>(null);
  if (!s || !snap.info?.features.snapshots) {
    return null;
  }
  const server = snap.server;
  const list = snap.snapshots?.snapshots ?? [];
  const take = async () => {
    setBusy('snapshot');
    try {
      const out = await props.model.api.snapshotNow();
      const missing = out.kernels - out.saved;
      Notification.emit(
        `Snapshot taken: ${out.saved} of ${out.kernels} kernel${out.kernels === 1 ? '' : 's'} ` +
          `saved (${formatBytes(out.stored_bytes)}, ${out.methods.map(methodWords).join(' + ') || 'nothing saved'})` +
          (missing ? `; ${missing} could not be saved (see the list).` : '.'),
        missing ? 'warning' : 'success',
        { autoClose: 6000 }
      );
    } catch (e: any) {
      Notification.error(`The snapshot was not taken: ${e?.message ?? e}`);
    } finally {
      setBusy(null);
      void props.model.refresh();
    }
  };
  const restore = async (item: ISnapshotSet) => {
    const when = formatClock(toLocalMs(item.created_at, snap.offsetMs), props.now);
    const where = item.kernels.flatMap(k => k.notebooks).join(', ') || 'its notebooks';
    const result = await showDialog({
      title: `Restore the snapshot of ${when}?`,
      body:
        `The kernels of ${where} are replaced by the ones saved at ${when}; what they hold ` +
        'now is lost unless you take a snapshot first.',
      buttons: [Dialog.cancelButton({ label: 'Keep them' }), Dialog.warnButton({ label: 'Restore' })]
    });
    if (!result.button.accept) {
      return;
    }
    setBusy(item.id);
    try {
      // what came back is told once, from the service's record of it (the notifications)
      await props.model.api.restore(item.id);
    } catch (e: any) {
      Notification.error(`The snapshot was not restored: ${e?.message ?? e}`);
    } finally {
      setBusy(null);
      void props.model.refresh();
    }
  };
  return (
    <Section title="Snapshots" id="jp-GpuBudget-snapshots">
      {s.restored && <RestoredView r={s.restored} now={props.now} offsetMs={snap.offsetMs} />}
      {s.snapshot_lost && (
        <div className="jp-GpuBudget-error" role="alert">
          Kernel state lost {formatClock(toLocalMs(s.snapshot_lost.at, snap.offsetMs), props.now)}:{' '}
          {s.snapshot_lost.reason}
        </div>
      )}
      {server && !server.enabled && (
        <p className="jp-GpuBudget-muted">Snapshots are not available in this server: {server.problem}</p>
      )}
      {server?.enabled && (
        <p className="jp-GpuBudget-muted">
          Your kernels are saved ({server.methods.map(methodWords).join(', then ')}) before a
          preemption stops this server, and restored when the session starts again.
        </p>
      )}
      <div className="jp-GpuBudget-actions">
        <button
          className="jp-GpuBudget-button"
          onClick={() => void take()}
          disabled={busy !== null || !server?.enabled || server.taking}
          title="Save every kernel of this server now; they run on"
        >
          {busy === 'snapshot' || server?.taking ? 'Taking a snapshot…' : 'Snapshot now'}
        </button>
      </div>
      {list.length ? (
        <ul className="jp-GpuBudget-snapshots" aria-label="snapshots of this session">
          {list.slice(0, 8).map(item => (
            <SnapshotItem
              key={item.id}
              {...props}
              s={item}
              busy={busy !== null}
              onRestore={() => void restore(item)}
            />
          ))}
        </ul>
      ) : (
        <p className="jp-GpuBudget-muted">No snapshot of this session yet.</p>
      )}
      {snap.snapshots && (
        <p className="jp-GpuBudget-muted">
          The last {snap.snapshots.keep_last} are kept
          {snap.snapshots.quota_bytes
            ? `; the project's snapshots may use ${formatBytes(snap.snapshots.quota_bytes)} (now ${formatBytes(snap.snapshots.project_bytes)})`
            : ''}
          .
        </p>
      )}
    </Section>
  );
}

// ------------------------------------------------------------------ panel
export function BudgetView(props: IProps) {
  const snap = props.model.snapshot;
  const info = snap.info;
  const updated = snap.info ? formatClock(snap.receivedAt, props.now) : null;
  return (
    <div className="jp-GpuBudget-panel">
      <header className="jp-GpuBudget-header">
        <h2>GPU budget</h2>
        <button
          className="jp-GpuBudget-button"
          onClick={() => void props.model.refresh()}
          title="Ask the gpubudget service again now"
        >
          Refresh
        </button>
      </header>
      {!info && !snap.error && <p className="jp-GpuBudget-muted">Loading…</p>}
      {snap.error && (
        <div className="jp-GpuBudget-error" role="alert">
          {info && !info.service.configured
            ? 'Not connected to a gpubudget service: '
            : 'The gpubudget service did not answer: '}
          {snap.error}
        </div>
      )}
      {info && info.service.configured && info.service.reachable && (
        <>
          <SessionSection {...props} />
          <MyWeekSection model={props.model} />
          <HistorySection {...props} />
          <SnapshotSection {...props} />
          <NoticesSection {...props} />
          <BudgetSection {...props} />
          <WorkSection {...props} />
          <EndedSection {...props} />
        </>
      )}
      {updated && (
        <footer className="jp-GpuBudget-muted">
          Updated {updated}; refreshes every {props.settings.refreshInterval} s.{' '}
          <span className="jp-GpuBudget-zone">
            Times are local:{' '}
            {formatZone(
              Intl.DateTimeFormat().resolvedOptions().timeZone,
              -new Date(props.now).getTimezoneOffset()
            )}
          </span>
        </footer>
      )}
    </div>
  );
}

export class BudgetPanel extends ReactWidget {
  now = Date.now();

  constructor(
    readonly model: BudgetModel,
    public settings: ISettings
  ) {
    super();
    this.addClass('jp-GpuBudget');
    model.changed.connect(() => this.update(), this);
  }

  tick(now: number): void {
    this.now = now;
    if (this.isVisible) {
      this.update();
    }
  }

  render(): JSX.Element {
    return <BudgetView model={this.model} settings={this.settings} now={this.now} />;
  }
}
