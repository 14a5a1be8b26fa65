//! What the workflow services (`Arrays`, `Pipelines`, `Sweeps`) use of the control plane:
//! its entry points, its reads, the store for their own creations (groups, stages,
//! trials), the metrics and the clock, and the sweeps still open — taken once from
//! [`Control`], so each service holds the same parts and nothing else of it.

use std::sync::Arc;

use tacc_store::Store;

use super::sweeps::OpenSweeps;
use super::{Control, Facts};
use crate::clock::Clock;
use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub(crate) struct WorkflowParts {
    pub(crate) control: Arc<Control>,
    pub(crate) facts: Facts,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Sweeps whose trials the controller still launches or stops.
    pub(crate) sweeps: Arc<OpenSweeps>,
}

impl WorkflowParts {
    pub(crate) fn of(control: &Arc<Control>) -> WorkflowParts {
        WorkflowParts {
            control: control.clone(),
            facts: control.facts.clone(),
            store: control.store.clone(),
            metrics: control.metrics.clone(),
            clock: control.clock.clone(),
            sweeps: control.sweeps.clone(),
        }
    }
}
