//! Tasks: submit one, list them (and page through the history of ended ones), read one's
//! detail, events, explanation and compiled instruction, cancel it or run it again. Submit,
//! cancel and rerun carry an idempotency key, so a retried request does the work once.

use reqwest::Method;
use tacc_core::{TaskId, TaskState};
use tacc_proto::{CancelReply, SubmitReply, SubmitTask, TaskEventView, TaskExplanation, TaskView};

use crate::{Client, Result};

/// Filter of [`Client::list_tasks`].
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub states: Vec<TaskState>,
    pub user: Option<String>,
    pub limit: Option<u32>,
    /// Only tasks that are no group's element.
    pub ungrouped: bool,
}

/// Filter of [`Client::history`].
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    pub name: Option<String>,
    pub states: Vec<TaskState>,
    pub since: Option<tacc_core::Timestamp>,
    pub user: Option<String>,
    /// The `next` of the previous page.
    pub before: Option<String>,
    pub limit: Option<u32>,
}

impl Client {
    pub async fn submit(&self, task: &SubmitTask) -> Result<SubmitReply> {
        self.keyed_json(|| self.request(Method::POST, "/v1/tasks").json(task))
            .await
    }

    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskView>> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if !query.states.is_empty() {
            let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
            params.push(("state", states.join(",")));
        }
        if let Some(user) = &query.user {
            params.push(("user", user.clone()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        if query.ungrouped {
            params.push(("ungrouped", "true".into()));
        }
        self.json(self.request(Method::GET, "/v1/tasks").query(&params))
            .await
    }

    /// One page of ended tasks, newest end first.
    pub async fn history(&self, query: &HistoryQuery) -> Result<tacc_proto::HistoryPage> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(name) = &query.name {
            params.push(("name", name.clone()));
        }
        if !query.states.is_empty() {
            let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
            params.push(("state", states.join(",")));
        }
        if let Some(since) = query.since {
            params.push(("since", since.as_millis().to_string()));
        }
        if let Some(user) = &query.user {
            params.push(("user", user.clone()));
        }
        if let Some(before) = &query.before {
            params.push(("before", before.clone()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.json(self.request(Method::GET, "/v1/history").query(&params))
            .await
    }

    pub async fn get_task(&self, id: TaskId) -> Result<TaskView> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}")))
            .await
    }

    pub async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEventView>> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/events")))
            .await
    }

    /// When a task with `spec` would start on this cluster if submitted now.
    pub async fn estimate(&self, spec: &serde_json::Value) -> Result<tacc_proto::SubmitEstimate> {
        let query = tacc_proto::EstimateQuery { spec: spec.clone() };
        self.json(self.request(Method::POST, "/v1/estimate").json(&query))
            .await
    }

    pub async fn explain(&self, id: TaskId) -> Result<TaskExplanation> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/why")))
            .await
    }

    pub async fn task_instruction(&self, id: TaskId) -> Result<serde_json::Value> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/instruction")))
            .await
    }

    /// Submit task `id` again (same snapshot, environment and datasets) as a new task.
    pub async fn rerun(&self, id: TaskId) -> Result<SubmitReply> {
        self.keyed_json(|| self.request(Method::POST, &format!("/v1/tasks/{id}/rerun")))
            .await
    }

    pub async fn cancel(&self, id: TaskId) -> Result<CancelReply> {
        self.keyed_json(|| self.request(Method::POST, &format!("/v1/tasks/{id}/cancel")))
            .await
    }
}
