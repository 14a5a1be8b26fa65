//! What the cluster is and offers: whether it answers, its nodes, and the datasets the
//! administrator registered.

use reqwest::Method;
use tacc_proto::{Health, NodeView};

use crate::{Client, Result};

impl Client {
    pub async fn health(&self) -> Result<Health> {
        self.json(self.request(Method::GET, "/v1/health")).await
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeView>> {
        self.json(self.request(Method::GET, "/v1/nodes")).await
    }

    /// Datasets the administrator registered.
    pub async fn list_datasets(&self) -> Result<Vec<tacc_proto::DatasetView>> {
        self.json(self.request(Method::GET, "/v1/datasets")).await
    }
}
