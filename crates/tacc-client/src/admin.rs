//! Administration under `/v1/admin` (an admin's token): users, API tokens, agent join
//! tokens, draining and removing nodes, the audit log, and a chunk garbage-collection pass.

use reqwest::Method;
use tacc_proto::NodeView;

use crate::{Client, Result};

impl Client {
    pub async fn create_user(
        &self,
        user: &tacc_proto::CreateUser,
    ) -> Result<tacc_proto::UserCreated> {
        self.json(self.request(Method::POST, "/v1/admin/users").json(user))
            .await
    }

    pub async fn list_users(&self) -> Result<Vec<tacc_proto::UserView>> {
        self.json(self.request(Method::GET, "/v1/admin/users"))
            .await
    }

    pub async fn create_token(
        &self,
        token: &tacc_proto::CreateToken,
    ) -> Result<tacc_proto::TokenIssued> {
        self.json(self.request(Method::POST, "/v1/admin/tokens").json(token))
            .await
    }

    pub async fn list_tokens(&self) -> Result<Vec<tacc_proto::TokenView>> {
        self.json(self.request(Method::GET, "/v1/admin/tokens"))
            .await
    }

    pub async fn revoke_token(&self, id: u64) -> Result<()> {
        self.send(self.request(Method::POST, &format!("/v1/admin/tokens/{id}/revoke")))
            .await?;
        Ok(())
    }

    /// Drain a node (`resume: false`) or let it take tasks again (`resume: true`).
    pub async fn drain_node(&self, name: &str, resume: bool) -> Result<NodeView> {
        let verb = if resume { "resume" } else { "drain" };
        self.json(self.request(Method::POST, &format!("/v1/admin/nodes/{name}/{verb}")))
            .await
    }

    /// Forget a node and revoke its credential.
    pub async fn remove_node(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &format!("/v1/admin/nodes/{name}")))
            .await?;
        Ok(())
    }

    /// A join token with which a new agent can enrol its node: one node, any name, by
    /// default; only `node` when given; up to `nodes` nodes when given.
    pub async fn create_agent_token(
        &self,
        ttl_secs: Option<u64>,
        node: Option<&str>,
        nodes: Option<u32>,
    ) -> Result<tacc_proto::TokenIssued> {
        let mut request = self.request(Method::POST, "/v1/admin/agent-tokens");
        if let Some(ttl) = ttl_secs {
            request = request.query(&[("ttl_secs", ttl)]);
        }
        if let Some(node) = node {
            request = request.query(&[("node", node)]);
        }
        if let Some(nodes) = nodes {
            request = request.query(&[("nodes", nodes)]);
        }
        self.json(request).await
    }

    /// Approve a node that enrolled while the server requires approval.
    pub async fn approve_node(&self, name: &str) -> Result<NodeView> {
        self.json(self.request(Method::POST, &format!("/v1/admin/nodes/{name}/approve")))
            .await
    }

    pub async fn audit(&self, limit: u32) -> Result<Vec<tacc_proto::AuditView>> {
        self.json(
            self.request(Method::GET, "/v1/admin/audit")
                .query(&[("limit", limit)]),
        )
        .await
    }

    /// Run one chunk garbage-collection pass on the server now.
    pub async fn collect_garbage(&self) -> Result<tacc_proto::GcReport> {
        self.json(self.request(Method::POST, "/v1/admin/gc")).await
    }

    /// Stop the embedded cluster (`tcloud down`): at once when no task is active, else as
    /// `mode` says (see [`tacc_proto::StopMode`]).
    pub async fn stop_cluster(
        &self,
        mode: tacc_proto::StopMode,
    ) -> Result<tacc_proto::ClusterStopView> {
        let body = tacc_proto::StopCluster { mode };
        self.json(
            self.request(Method::POST, "/v1/admin/cluster/stop")
                .json(&body),
        )
        .await
    }

    /// How far a stop of the embedded cluster has got.
    pub async fn cluster_stop(&self) -> Result<tacc_proto::ClusterStopView> {
        self.json(self.request(Method::GET, "/v1/admin/cluster/stop"))
            .await
    }
}
