//! The kit's own namespace handling: unique names, deletion on drop.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use sandhub_testkit::namespace::TEST_NAMESPACE_LABEL;
use sandhub_testkit::TestCluster;

#[tokio::test]
async fn fresh_namespaces_are_distinct_and_deleted_on_drop() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let a = cluster.fresh_namespace("kit").await.unwrap();
    let b = cluster.fresh_namespace("kit").await.unwrap();
    assert_ne!(a.name(), b.name());
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let found = namespaces.get(a.name()).await.unwrap();
    assert_eq!(
        found
            .metadata
            .labels
            .unwrap()
            .get(TEST_NAMESPACE_LABEL)
            .map(String::as_str),
        Some("true")
    );

    let name = a.name().to_string();
    drop(a); // deletes synchronously from its own runtime
    let after = namespaces.get_opt(&name).await.unwrap();
    assert!(
        after.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()),
        "{name} is being deleted after drop"
    );
    assert!(namespaces
        .get(b.name())
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
}
