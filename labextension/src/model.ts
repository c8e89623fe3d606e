/**
 * One refresh = one snapshot of what the service says about this session, its project chain,
 * my other work and my notices. Failures keep the previous figures and say why.
 */
import { ISignal, Signal } from '@lumino/signaling';

import {
  ApiError,
  GpuBudgetClient,
  IAccount,
  IEndedWorkload,
  INotice,
  ISessionHistory,
  ISession,
  IWorkload
} from './api';
import { accountChain, emptySnapshot, ISnapshot } from './state';

function why(e: unknown): string {
  if (e instanceof ApiError) {
    return e.message;
  }
  return e instanceof Error ? e.message : String(e);
}

export class BudgetModel {
  private _snapshot: ISnapshot;
  private _changed = new Signal<this, ISnapshot>(this);
  private _busy: Promise<ISnapshot> | null = null;

  constructor(
    private readonly client: GpuBudgetClient,
    private readonly now: () => number = () => Date.now(),
    private readonly timeZone: string = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC'
  ) {
    this._snapshot = emptySnapshot(now());
  }

  get snapshot(): ISnapshot {
    return this._snapshot;
  }

  get changed(): ISignal<this, ISnapshot> {
    return this._changed;
  }

  get api(): GpuBudgetClient {
    return this.client;
  }

  /** Refresh from the service; concurrent calls share one refresh. */
  refresh(): Promise<ISnapshot> {
    if (!this._busy) {
      this._busy = this.load().finally(() => {
        this._busy = null;
      });
    }
    return this._busy;
  }

  private async load(): Promise<ISnapshot> {
    const prev = this._snapshot;
    const t0 = this.now();
    let snap: ISnapshot;
    try {
      const info = await this.client.info();
      const t1 = this.now();
      const offsetMs = info.server_time * 1000 - (t0 + t1) / 2;
      if (!info.service.configured || !info.service.reachable) {
        snap = {
          ...emptySnapshot(t1),
          offsetMs,
          info,
          error: info.service.message || 'the gpubudget service cannot be reached'
        };
      } else {
        const errors: string[] = [];
        const settle = async <T>(p: Promise<T>, fallback: T): Promise<T> => {
          try {
            return await p;
          } catch (e) {
            errors.push(why(e));
            return fallback;
          }
        };
        // asked beside the others, not after them: the refresh takes no longer for it
        const historyAsked =
          info.session && info.features.session_history
            ? settle<ISessionHistory | null>(this.client.history(info.session), prev.history)
            : Promise.resolve(null);
        const answers = await Promise.all([
          info.session
            ? settle<ISession | null>(this.client.session(info.session), prev.session)
            : Promise.resolve(null),
          settle<IAccount[]>(this.client.accounts(), prev.chain),
          settle<IWorkload[]>(this.client.myWork(['pending', 'running']), prev.work),
          settle<INotice[]>(this.client.notices(), prev.notices),
          settle<IEndedWorkload[] | null>(this.client.ended(5), prev.ended)
        ]);
        let session: ISession | null = answers[0] as ISession | null;
        const [, accounts, mine, notices, ended] = answers;
        const receivedAt = this.now();
        if (session !== null && session === prev.session && session.protected_left_s !== null) {
          // the previous answer, aged: its countdown ran on since it arrived
          const aged = (receivedAt - prev.receivedAt) / 1000;
          const left: number = Math.max(0, session.protected_left_s - aged);
          session = { ...session, protected_left_s: left };
        }
        const project = session?.project ?? info.project;
        const chain = accountChain(accounts, project);
        const leaf = chain.length ? chain[0].name : null;
        const [usage, daily] = leaf
          ? await Promise.all([
              settle(this.client.usage(leaf), prev.usage),
              info.features.usage_daily
                ? settle(this.client.usageDaily(leaf, this.timeZone), prev.daily)
                : Promise.resolve(null)
            ])
          : [null, null];
        const history = await historyAsked;
        const [snapshots, server] =
          info.features.snapshots && info.session
            ? await Promise.all([
                settle(this.client.snapshots(info.session), prev.snapshots),
                settle(this.client.serverSnapshots(), prev.server)
              ])
            : [null, null];
        snap = {
          receivedAt,
          offsetMs,
          info,
          session,
          chain,
          usage,
          daily,
          work: mine.filter(w => w.id !== info.session),
          ended,
          notices,
          history,
          snapshots,
          server,
          error: errors.length ? errors[0] : null
        };
      }
    } catch (e) {
      snap = { ...prev, error: why(e) };
    }
    this._snapshot = snap;
    this._changed.emit(snap);
    return snap;
  }
}
