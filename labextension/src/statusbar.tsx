/**
 * The status-bar item: "protected 1h12m · 0.31 GPU-h", colour-coded; a button that opens the
 * sidebar (Enter or Space when focused).
 */
import { ReactWidget } from '@jupyterlab/apputils';
import React from 'react';

import { BudgetModel } from './model';
import { forecastShort } from './preemption';
import { ISettings, statusFor } from './state';

export class BudgetStatus extends ReactWidget {
  now = Date.now();

  constructor(
    readonly model: BudgetModel,
    public settings: ISettings,
    private readonly open: () => void
  ) {
    super();
    this.addClass('jp-GpuBudget-status');
    model.changed.connect(() => this.update(), this);
  }

  tick(now: number): void {
    this.now = now;
    this.update();
  }

  render(): JSX.Element | null {
    const status = statusFor(this.model.snapshot, this.now, this.settings);
    if (!status) {
      return null;
    }
    const forecast = forecastShort(this.model.snapshot, this.now); // while it is likely
    return (
      <button
        className={`jp-GpuBudget-statusButton jp-GpuBudget-${status.level}`}
        onClick={this.open}
        title={`${status.label}${forecast ? `; ${forecast}` : ''}. Click for details.`}
        aria-label={`${status.label}${forecast ? `; ${forecast}` : ''}. Open the GPU budget panel.`}
      >
        <span className="jp-GpuBudget-dot" aria-hidden="true" />
        {status.text}
        {forecast && ` · ${forecast}`}
      </button>
    );
  }
}
