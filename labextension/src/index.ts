/**
 * jupyter-gpubudget: the researcher's view in JupyterLab. A left sidebar panel "GPU budget"
 * and a status-bar item, fed by the server extension `jupyter_gpubudget.serverext`.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';

import iconSvg from '../style/icon.svg';
import { Fetcher, GpuBudgetClient } from './api';
import { BudgetModel } from './model';
import { BudgetPanel } from './sidebar';
import {
  DEFAULT_SETTINGS,
  ISettings,
  needsLauncher,
  normalizeSettings,
  NoticeTracker
} from './state';
import { BudgetStatus } from './statusbar';
import { StopWarning } from './warning';

const PLUGIN_ID = 'jupyter-gpubudget:plugin';

export const gpuBudgetIcon = new LabIcon({ name: 'jupyter-gpubudget:icon', svgstr: iconSvg });

namespace CommandIDs {
  export const open = 'gpubudget:open';
  export const refresh = 'gpubudget:refresh';
}

function serverFetcher(): Fetcher {
  const settings = ServerConnection.makeSettings();
  const base = settings.baseUrl.replace(/\/?$/, '/') + 'gpubudget/api/';
  return (path, init) => ServerConnection.makeRequest(base + path, init ?? {}, settings);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU budget sidebar and status bar for jupyter-gpubudget.',
  autoStart: true,
  optional: [ISettingRegistry, IStatusBar, ICommandPalette, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    registry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    labShell: ILabShell | null
  ) => {
    let settings: ISettings = { ...DEFAULT_SETTINGS };
    const client = new GpuBudgetClient(serverFetcher());
    const model = new BudgetModel(client);
    const warning = new StopWarning(app.commands, model, client);
    const panel = new BudgetPanel(model, settings);
    panel.id = 'jp-gpubudget-panel';
    panel.title.icon = gpuBudgetIcon;
    panel.title.caption = 'GPU budget';
    panel.node.setAttribute('aria-label', 'GPU budget');
    panel.node.setAttribute('role', 'region');
    app.shell.add(panel, 'left', { rank: 900 });

    const open = () => app.shell.activateById(panel.id);
    app.commands.addCommand(CommandIDs.open, {
      label: 'Show GPU budget',
      caption: 'Open the GPU budget sidebar: protected time, cost, budget, queue',
      icon: gpuBudgetIcon,
      execute: open
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh GPU budget',
      execute: () => model.refresh()
    });
    palette?.addItem({ command: CommandIDs.open, category: 'GPU budget' });
    palette?.addItem({ command: CommandIDs.refresh, category: 'GPU budget' });

    let status: BudgetStatus | null = null;
    if (statusBar) {
      const activeChanged = new Signal<BudgetModel, void>(model);
      model.changed.connect(() => activeChanged.emit());
      status = new BudgetStatus(model, settings, open);
      statusBar.registerStatusItem(PLUGIN_ID, {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => model.snapshot.session !== null,
        activeStateChanged: activeChanged
      });
    }

    const tracker = new NoticeTracker(Date.now() / 1000);
    const notify = () => {
      const now = Date.now();
      for (const n of tracker.check(model.snapshot, now, settings)) {
        if (settings.notifications) {
          Notification.emit(n.message, n.type, {
            autoClose: n.sticky ? false : 10000,
            actions: [{ label: 'Details', callback: open, caption: 'Open the GPU budget panel' }]
          });
        }
      }
    };
    model.changed.connect(notify);

    // the countdown: re-render every second; ask the service every refreshInterval
    const ticker = window.setInterval(() => {
      const now = Date.now();
      panel.tick(now);
      status?.tick(now);
      notify();
      warning.tick(now);
    }, 1000);
    let poller = 0;
    const schedule = () => {
      window.clearInterval(poller);
      poller = window.setInterval(() => void model.refresh(), settings.refreshInterval * 1000);
    };
    const apply = (s: ISettings) => {
      settings = s;
      panel.settings = s;
      if (status) {
        status.settings = s;
      }
      schedule();
      panel.update();
      status?.update();
    };
    panel.disposed.connect(() => {
      window.clearInterval(ticker);
      window.clearInterval(poller);
    });

    if (registry) {
      registry
        .load(PLUGIN_ID)
        .then(s => {
          const read = () => apply(normalizeSettings(s.composite as any));
          read();
          s.changed.connect(read);
        })
        .catch(reason => {
          console.warn('jupyter-gpubudget: settings not loaded, using defaults', reason);
          schedule();
        });
    } else {
      schedule();
    }
    void app.restored.then(() => model.refresh());
    if (labShell) {
      // the lab opens on a Launcher: a layout restored with terminals alone gets one in
      // front (an empty main area gets JupyterLab's own)
      void app.restored.then(() => {
        const kinds = [...labShell.widgets('main')].map(w =>
          w.node.querySelector('.jp-Launcher') || w.hasClass('jp-Launcher')
            ? ('launcher' as const)
            : w.node.querySelector('.jp-Terminal') || w.hasClass('jp-Terminal')
              ? ('terminal' as const)
              : ('other' as const)
        );
        if (needsLauncher(kinds) && app.commands.hasCommand('launcher:create')) {
          void app.commands.execute('launcher:create');
        }
      });
      // figures may be stale after the panel was hidden for a while
      labShell.currentChanged.connect(() => {
        if (panel.isVisible && Date.now() - model.snapshot.receivedAt > 5000) {
          void model.refresh();
        }
      });
    }
  }
};

export default plugin;
