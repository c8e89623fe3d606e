/**
 * The lab's warning before a preempted session's server stops: a JupyterLab notification
 * with the time left (updated every second) and "Save and release now" — every notebook is
 * saved, then the session is released through the service (the preemption goes ahead now;
 * the kernels are still saved and restored).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { GpuBudgetClient } from './api';
import { BudgetModel } from './model';
import { forecastAt, stopNotice } from './preemption';

export class StopWarning {
  private shown: string | null = null;
  private id: string | null = null;
  private released = false;
  private lastRefresh = 0;

  constructor(
    private readonly commands: JupyterFrontEnd['commands'],
    private readonly model: BudgetModel,
    private readonly client: GpuBudgetClient
  ) {}

  /** Every second: show, update or close the warning; ask the service more often while a
   * preemption is near (the usual refresh may be minutes apart). */
  tick(now: number): void {
    const snap = this.model.snapshot;
    const n = stopNotice(snap, now);
    const near = forecastAt(snap.session, snap);
    if ((n || (near !== null && near - now < 3 * 60_000)) && now - this.lastRefresh > 5000) {
      this.lastRefresh = now;
      void this.model.refresh();
    }
    if (!n) {
      if (this.id !== null) {
        Notification.dismiss(this.id);
        this.id = null;
        this.shown = null;
      }
      return;
    }
    const message = this.released
      ? 'Released: your notebooks were saved; this server stops now and its kernels are saved and restored when the session starts again.'
      : n.message;
    const options = {
      autoClose: false as const,
      actions: this.released
        ? []
        : [
            {
              label: 'Save and release now',
              caption: 'Save every notebook, then let this server stop now',
              displayType: 'accent' as const,
              callback: (event: Event) => {
                event.preventDefault(); // the warning stays, saying what happens
                void this.saveAndRelease(n.sessionId);
              }
            }
          ]
    };
    if (this.shown !== n.key || this.id === null) {
      this.shown = n.key;
      this.released = false;
      this.id = Notification.emit(n.message, 'error', options);
    } else {
      Notification.update({ id: this.id, message, type: 'error', ...options });
    }
  }

  async saveAndRelease(sessionId: string): Promise<void> {
    try {
      if (this.commands.hasCommand('docmanager:save-all')) {
        await this.commands.execute('docmanager:save-all');
      }
    } catch (reason) {
      console.warn('jupyter-gpubudget: saving the notebooks failed', reason);
    }
    try {
      await this.client.release(sessionId);
      this.released = true;
    } catch (reason) {
      Notification.error(`Releasing this server failed: ${(reason as Error).message ?? reason}`, {
        autoClose: 10000
      });
    }
    void this.model.refresh();
  }
}
