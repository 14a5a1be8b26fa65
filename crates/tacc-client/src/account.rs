//! The caller's own account: whom the server takes the token for, and the caller's
//! secrets (set, listed by name, deleted; a value is never sent back).

use reqwest::Method;

use crate::{Client, Result};

impl Client {
    /// Who the server takes this client's token for.
    pub async fn whoami(&self) -> Result<tacc_proto::WhoAmI> {
        self.json(self.request(Method::GET, "/v1/whoami")).await
    }

    /// Set (or replace) one of the caller's secrets; the value is never sent back.
    pub async fn put_secret(&self, name: &str, value: Vec<u8>) -> Result<()> {
        self.send(
            self.request(Method::PUT, &format!("/v1/secrets/{name}"))
                .body(value),
        )
        .await?;
        Ok(())
    }

    pub async fn list_secrets(&self) -> Result<Vec<tacc_proto::SecretView>> {
        self.json(self.request(Method::GET, "/v1/secrets")).await
    }

    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &format!("/v1/secrets/{name}")))
            .await?;
        Ok(())
    }
}
