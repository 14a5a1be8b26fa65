//! The server's Prometheus metrics (`GET /metrics`, text format). Events are counted
//! where they happen (submissions, log bytes, scheduler decisions, store commits, tasks
//! starting); what describes the present (tasks by state, the queue by pending reason,
//! nodes by state, GPUs per node) is read from the store and the control plane's memory
//! at each scrape, so it can never drift from what the API shows. Labels take values
//! from small fixed sets or node names (bounded by the cluster's size), never task ids
//! or free text: a pending reason is reduced to its kind by [`reason_kind`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tacc_core::{AttemptNo, NodeId, TaskState, Timestamp};
use tacc_proto::NodeView;
use tacc_store::{Store, TaskFilter};

use crate::usage::UsageBook;
use crate::{Control, ServerError};

/// The states `tacc_nodes` reports (as `GET /v1/nodes` names them), each always present.
pub(crate) const NODE_STATES: [&str; 6] =
    ["up", "pending", "draining", "drained", "flapping", "down"];

/// The kinds `tacc_queued_tasks` sorts pending reasons into, each always present.
pub(crate) const REASON_KINDS: [&str; 7] = [
    "resources",
    "priority",
    "quota",
    "dependency",
    "node_selector",
    "no_nodes",
    "other",
];

/// The kind of a queued task's stored reason, one of [`REASON_KINDS`]. The reason is
/// the scheduler's `PendingReason` as displayed, or the control plane's own while no node
/// is online; anything else (a retried attempt's last failure, no reason yet) is `other`.
pub(crate) fn reason_kind(reason: Option<&str>) -> &'static str {
    let Some(reason) = reason else {
        return "other";
    };
    const KINDS: [(&str, &str); 8] = [
        ("waiting for resources", "resources"),
        ("queued behind task ", "priority"),
        ("lower priority:", "priority"),
        ("over user quota:", "quota"),
        ("over quota of group ", "quota"),
        ("waiting for task ", "dependency"),
        ("no node can run it yet:", "node_selector"),
        (crate::control::NO_NODE_REASON, "no_nodes"),
    ];
    KINDS
        .iter()
        .find(|(prefix, _)| reason.starts_with(prefix))
        .map_or("other", |(_, kind)| kind)
}

/// Every metric of one server, in a registry of its own (several servers in one test
/// process must not share counters).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tasks: IntGaugeVec,
    queued: IntGaugeVec,
    nodes: IntGaugeVec,
    node_gpus: IntGaugeVec,
    node_gpus_allocated: IntGaugeVec,
    node_gpus_utilized: prometheus::GaugeVec,
    submissions: IntCounter,
    decision_seconds: Histogram,
    submit_to_start_seconds: Histogram,
    commit_seconds: HistogramVec,
    gpu_allocated_seconds: prometheus::CounterVec,
    gpu_busy_seconds: prometheus::CounterVec,
    /// Scrapes refresh the gauges and then read them: one at a time, so two scrapes never
    /// see each other's half-refreshed gauges.
    scrape: tokio::sync::Mutex<()>,
}

fn gauges(name: &str, help: &str, label: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &[label]).expect("a valid metric definition")
}

impl Metrics {
    /// The metrics of a server whose log book counts written bytes in `log_bytes`.
    pub(crate) fn new(log_bytes: IntCounter) -> Metrics {
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("a valid metric definition")
        };
        let metrics = Metrics {
            registry: Registry::new(),
            tasks: gauges("tacc_tasks", "Tasks by state.", "state"),
            queued: gauges(
                "tacc_queued_tasks",
                "Queued tasks by the kind of their pending reason.",
                "reason",
            ),
            nodes: gauges("tacc_nodes", "Registered nodes by state.", "state"),
            node_gpus: gauges("tacc_node_gpus", "GPUs a node offers.", "node"),
            node_gpus_allocated: gauges(
                "tacc_node_gpus_allocated",
                "GPUs of a node allocated to running attempts.",
                "node",
            ),
            node_gpus_utilized: prometheus::GaugeVec::new(
                Opts::new(
                    "tacc_node_gpus_utilized",
                    "GPUs of a node busy, in whole-GPU equivalents: the sum of the \
                     utilisation its running attempts' GPUs last reported, over 100.",
                ),
                &["node"],
            )
            .expect("a valid metric definition"),
            submissions: IntCounter::new("tacc_submissions_total", "Tasks submitted.")
                .expect("a valid metric definition"),
            decision_seconds: histogram(
                "tacc_scheduler_decision_seconds",
                "Time the scheduler took to decide on one event.",
                prometheus::exponential_buckets(0.0001, 4.0, 9).expect("valid buckets"),
            ),
            submit_to_start_seconds: histogram(
                "tacc_task_submit_to_start_seconds",
                "Time from a task's submission until its first attempt ran.",
                vec![
                    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
                    86400.0,
                ],
            ),
            commit_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "tacc_store_commit_seconds",
                    "Time a store transaction took to commit (durable on return): `create_task` \
                     for a submission, `apply` for task changes.",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 3.0, 9).expect("valid buckets")),
                &["op"],
            )
            .expect("a valid metric definition"),
            gpu_allocated_seconds: prometheus::CounterVec::new(
                Opts::new(
                    "tacc_gpu_allocated_seconds_total",
                    "GPU-seconds held by users' running attempts, as their samples cover them.",
                ),
                &["user"],
            )
            .expect("a valid metric definition"),
            gpu_busy_seconds: prometheus::CounterVec::new(
                Opts::new(
                    "tacc_gpu_busy_seconds_total",
                    "GPU-seconds those GPUs were busy (utilisation over 100); allocated minus \
                     busy is idle GPU time.",
                ),
                &["user"],
            )
            .expect("a valid metric definition"),
            scrape: tokio::sync::Mutex::new(()),
        };
        #[allow(unused_mut)] // the process metrics read Linux's /proc
        let mut collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(metrics.tasks.clone()),
            Box::new(metrics.queued.clone()),
            Box::new(metrics.nodes.clone()),
            Box::new(metrics.node_gpus.clone()),
            Box::new(metrics.node_gpus_allocated.clone()),
            Box::new(metrics.node_gpus_utilized.clone()),
            Box::new(metrics.submissions.clone()),
            Box::new(metrics.decision_seconds.clone()),
            Box::new(metrics.submit_to_start_seconds.clone()),
            Box::new(metrics.commit_seconds.clone()),
            Box::new(metrics.gpu_allocated_seconds.clone()),
            Box::new(metrics.gpu_busy_seconds.clone()),
            Box::new(log_bytes),
            Box::new(crate::daemon_log::lines_dropped()),
        ];
        #[cfg(target_os = "linux")]
        collectors.push(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        for collector in collectors {
            metrics
                .registry
                .register(collector)
                .expect("metric names are unique");
        }
        metrics
    }

    /// The counter a [`LogBook`](crate::logs::LogBook) adds the bytes it writes to.
    pub(crate) fn log_bytes_counter() -> IntCounter {
        IntCounter::new(
            "tacc_log_bytes_total",
            "Bytes of task output written to task logs.",
        )
        .expect("a valid metric definition")
    }

    /// `user`'s running attempts held GPUs for `allocated`, busy for `busy` of it.
    pub(crate) fn gpu_time(&self, user: &str, allocated: Duration, busy: Duration) {
        self.gpu_allocated_seconds
            .with_label_values(&[user])
            .inc_by(allocated.as_secs_f64());
        self.gpu_busy_seconds
            .with_label_values(&[user])
            .inc_by(busy.as_secs_f64());
    }

    pub(crate) fn submitted(&self) {
        self.submissions.inc();
    }

    pub(crate) fn decided(&self, took: Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
    }

    /// A task's attempt started running at `now`; only the first attempt counts (a retry's
    /// wait includes its earlier attempts).
    pub(crate) fn started(&self, submitted_at: Timestamp, attempt: AttemptNo, now: Timestamp) {
        if attempt == AttemptNo::FIRST {
            let waited = now.millis_since(submitted_at) as f64 / 1000.0;
            self.submit_to_start_seconds.observe(waited);
        }
    }

    pub(crate) fn committed(&self, op: &'static str, took: Duration) {
        self.commit_seconds
            .with_label_values(&[op])
            .observe(took.as_secs_f64());
    }

    /// How many store commits of kind `op` were timed (for the lifecycle tests).
    #[cfg(test)]
    pub(crate) fn commits(&self, op: &'static str) -> u64 {
        self.commit_seconds
            .with_label_values(&[op])
            .get_sample_count()
    }

    /// The text exposition of every metric as gathered now.
    fn encode(&self) -> Result<String, ServerError> {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|e| ServerError::Internal(format!("cannot encode the metrics: {e}")))
    }
}

/// One node's part of the scrape.
#[derive(Debug)]
struct NodeGauges {
    state: String,
    gpus: i64,
    allocated: i64,
}

/// The scrape (`GET /metrics`): the counted events of [`Metrics`], and the present read
/// from the store, the usage book and the control plane's view of the nodes.
#[derive(Debug, Clone)]
pub(crate) struct MetricsExport {
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    usage: Arc<UsageBook>,
}

impl MetricsExport {
    /// The export of `control`'s metrics, store and usage book.
    pub(crate) fn of(control: &Control) -> MetricsExport {
        MetricsExport {
            metrics: control.metrics.clone(),
            store: control.store.clone(),
            usage: control.usage.clone(),
        }
    }

    /// Refresh what describes the present, then encode everything. `nodes` and `names`
    /// are the control plane's (`Control::node_views`, `Control::node_names`).
    pub(crate) async fn text(
        &self,
        nodes: Vec<NodeView>,
        names: &BTreeMap<NodeId, String>,
    ) -> Result<String, ServerError> {
        let metrics = &self.metrics;
        let _one = metrics.scrape.lock().await;
        for state in TaskState::ALL {
            let count = self
                .store
                .count_tasks(&TaskFilter {
                    states: vec![state],
                    ..Default::default()
                })
                .await?;
            metrics
                .tasks
                .with_label_values(&[state.as_str()])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let queued = self
            .store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Queued],
                ..Default::default()
            })
            .await?;
        let mut by_kind: BTreeMap<&str, i64> = REASON_KINDS.iter().map(|k| (*k, 0)).collect();
        for task in &queued {
            *by_kind
                .entry(reason_kind(task.reason.as_deref()))
                .or_default() += 1;
        }
        for (kind, count) in by_kind {
            metrics.queued.with_label_values(&[kind]).set(count);
        }
        let nodes: Vec<(String, NodeGauges)> = nodes
            .into_iter()
            .map(|view| {
                let gauges = NodeGauges {
                    state: view.state,
                    gpus: i64::from(view.capacity.gpus),
                    allocated: i64::from(view.allocated.gpus),
                };
                (view.name, gauges)
            })
            .collect();
        let busy: BTreeMap<NodeId, u32> = self
            .usage
            .gpu_use_by_node(crate::usage::GPU_SAMPLE_FRESH)
            .into_iter()
            .map(|(node, gpus)| (node, gpus.percent_total()))
            .collect();
        let mut by_state: BTreeMap<&str, i64> = NODE_STATES.iter().map(|s| (*s, 0)).collect();
        // A node that left must not linger with its last values.
        metrics.node_gpus.reset();
        metrics.node_gpus_allocated.reset();
        metrics.node_gpus_utilized.reset();
        for (name, node) in &nodes {
            if let Some(count) = by_state.get_mut(node.state.as_str()) {
                *count += 1;
            }
            metrics.node_gpus.with_label_values(&[name]).set(node.gpus);
            metrics
                .node_gpus_allocated
                .with_label_values(&[name])
                .set(node.allocated);
            metrics
                .node_gpus_utilized
                .with_label_values(&[name])
                .set(0.0);
        }
        for (node, percent) in busy {
            if let Some(name) = names.get(&node) {
                metrics
                    .node_gpus_utilized
                    .with_label_values(&[name])
                    .set(f64::from(percent) / 100.0);
            }
        }
        for (state, count) in by_state {
            metrics.nodes.with_label_values(&[state]).set(count);
        }
        metrics.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::TaskId;
    use tacc_scheduler::{LimitKind, PendingReason};

    fn scrape(metrics: &Metrics) -> String {
        metrics.encode().unwrap()
    }

    /// The value of the sample line `series` (name and labels exactly as encoded).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn every_pending_reason_of_the_scheduler_has_its_kind() {
        let cases = [
            (PendingReason::WaitingForResources, "resources"),
            (
                PendingReason::BehindOlderTask {
                    blocked_by: TaskId(3),
                },
                "priority",
            ),
            (
                PendingReason::LowerPriority {
                    blocked_by: TaskId(3),
                },
                "priority",
            ),
            (
                PendingReason::OverUserQuota {
                    limit: LimitKind::Gpus,
                    max: 4,
                },
                "quota",
            ),
            (
                PendingReason::OverGroupQuota {
                    group: "vision".into(),
                    limit: LimitKind::RunningTasks,
                    max: 2,
                },
                "quota",
            ),
            (PendingReason::Dependency { on: TaskId(9) }, "dependency"),
            (
                PendingReason::NoMatchingNode {
                    detail: "needs gpu=a100".into(),
                },
                "node_selector",
            ),
            (
                PendingReason::CannotFit {
                    detail: "8 GPUs".into(),
                },
                "other",
            ),
        ];
        for (reason, kind) in cases {
            let text = reason.to_string();
            assert_eq!(reason_kind(Some(&text)), kind, "{text}");
            assert!(REASON_KINDS.contains(&kind));
        }
        assert_eq!(
            reason_kind(Some(crate::control::NO_NODE_REASON)),
            "no_nodes"
        );
        assert_eq!(reason_kind(Some("node_lost: n1 went silent")), "other");
        assert_eq!(reason_kind(None), "other");
    }

    #[test]
    fn events_are_counted_and_timed() {
        let log_bytes = Metrics::log_bytes_counter();
        let metrics = Metrics::new(log_bytes.clone());
        metrics.submitted();
        metrics.submitted();
        log_bytes.inc_by(12);
        metrics.decided(Duration::from_micros(300));
        metrics.committed("apply", Duration::from_millis(2));
        metrics.committed("apply", Duration::from_millis(4));
        metrics.started(Timestamp(10_000), AttemptNo::FIRST, Timestamp(12_500));
        // A retry's start is not a submission's wait.
        metrics.started(Timestamp(10_000), AttemptNo(2), Timestamp(99_000));
        let text = scrape(&metrics);
        assert_eq!(value(&text, "tacc_submissions_total"), Some(2.0), "{text}");
        assert_eq!(value(&text, "tacc_log_bytes_total"), Some(12.0), "{text}");
        assert_eq!(
            value(&text, "tacc_scheduler_decision_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "tacc_store_commit_seconds_count{op=\"apply\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "tacc_task_submit_to_start_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "tacc_task_submit_to_start_seconds_sum"),
            Some(2.5)
        );
        // 2.5 s falls in the 2.5 bucket, not in the 1 s one.
        assert_eq!(
            value(&text, "tacc_task_submit_to_start_seconds_bucket{le=\"1\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                "tacc_task_submit_to_start_seconds_bucket{le=\"2.5\"}"
            ),
            Some(1.0)
        );
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_cpu_seconds_total"), "{text}");
    }
}
