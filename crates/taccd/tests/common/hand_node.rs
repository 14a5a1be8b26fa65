//! A node of a test's own, registered with a join token, that speaks the agent protocol
//! by hand: it shows exactly which polls, reports and uploads the server takes from a
//! node. Test files add the protocol steps they need as methods.

use tacc_client::Client;

use super::Daemon;

pub struct HandNode {
    pub id: tacc_core::NodeId,
    pub client: Client,
}

impl HandNode {
    pub async fn register(server: &Daemon, name: &str) -> HandNode {
        let join = server.admin(&["agent-token", "--ttl", "1h"]);
        let registered = Client::new(&server.url)
            .with_token(join.trim())
            .register_agent(&tacc_proto::RegisterAgent {
                name: name.into(),
                capacity: tacc_core::Resources::new(4000, 8 << 30, 0),
                gpu_type: None,
                labels: Default::default(),
                running: vec![],
                address: "127.0.0.1".into(),
                gpus: vec![],
                life: 1,
            })
            .await
            .unwrap();
        HandNode {
            id: registered.node_id,
            client: Client::new(&server.url).with_token(registered.node_token.unwrap()),
        }
    }
}
