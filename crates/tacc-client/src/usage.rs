//! Resource use: what a running task's ranks use now (`tcloud top`), the resource-hours
//! allocated per user or group (`tcloud usage`), and the fair-share standing.

use reqwest::Method;
use tacc_core::TaskId;

use crate::{Client, Result};

impl Client {
    /// What the task's ranks use now, their peaks, and its flags (`tcloud top`).
    pub async fn task_usage(&self, id: TaskId) -> Result<tacc_proto::TaskUsage> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/usage")))
            .await
    }

    /// Allocated resource-hours by user or group over a window (`tcloud usage`).
    pub async fn usage_report(
        &self,
        query: &tacc_proto::UsageQuery,
    ) -> Result<tacc_proto::UsageReport> {
        self.json(self.request(Method::GET, "/v1/usage").query(query))
            .await
    }

    /// The scheduler's fair-share standing (`tcloud usage --fairshare`).
    pub async fn fairshare_report(&self) -> Result<tacc_proto::FairShareReport> {
        self.json(self.request(Method::GET, "/v1/usage/fairshare"))
            .await
    }
}
