//! `skiff uninstall` after `skiff server` with a local Docker node: a server stopped with SIGTERM
//! leaves its pods, rules and routes in place (fail-static, as kube-proxy and the kubelet), and
//! uninstall then removes exactly what that node put on the host, leaving another cluster's
//! things alone.

#![cfg(test)]

mod common;

use std::process::Command;

use common::node::{CLIENT, Node};
use common::{skiff_bin, tail};

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn nft_tables() -> String {
    run("nft", &["list", "tables"])
}

fn routes_proto_83() -> String {
    run("ip", &["-4", "route", "show", "proto", "83"])
}

fn local_routes() -> String {
    run("ip", &["-4", "route", "show", "table", "local"])
}

fn containers_of(cluster_label: &str) -> Vec<String> {
    run(
        "docker",
        &[
            "ps",
            "-aq",
            "--filter",
            &format!("label=io.skiff.cluster={cluster_label}"),
        ],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Another cluster's nftables table and route, which uninstall must leave; removed on drop.
struct Decoy {
    table: String,
    route: String,
}

impl Decoy {
    fn new(tag: u16) -> Decoy {
        let d = Decoy {
            table: format!("skiff-decoy-{}", std::process::id()),
            // An unreachable route of Skiff's protocol outside this test's cluster CIDR.
            route: format!("10.220.{}.0/24", tag % 256),
        };
        let ok = Command::new("nft")
            .args(["add", "table", "ip", &d.table])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "nft add table");
        let ok = Command::new("ip")
            .args(["-4", "route", "replace", "unreachable", &d.route, "proto", "83"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip route add");
        d
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "ip", &self.table])
            .status();
        let _ = Command::new("ip")
            .args(["-4", "route", "del", "unreachable", &self.route, "proto", "83"])
            .status();
    }
}

#[test]
fn sigterm_keeps_the_nodes_rules_and_uninstall_removes_only_this_clusters() {
    let port_tag = common::free_port() % 256;
    let cluster_cidr = format!("10.{}.{}.0/20", 224 + port_tag / 16, (port_tag % 16) * 16);
    let mut n = Node::start(
        "uninstall",
        &["--cluster-cidr", &cluster_cidr, "--node-cidr-mask-size", "24"],
    );
    let data_dir = n.c.path().to_path_buf();
    let service_range = n.c.service_range.clone().expect("the harness's service range");
    n.c.apply(CLIENT, &[]);
    n.wait_running("client");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir.join("agent/host.json")).expect("the agent's host record"))
            .expect("json");
    let cluster = record["cluster"].as_str().expect("the cluster uid").to_string();
    let network = record["dockerNetwork"].as_str().expect("the pod network").to_string();
    let pod_cidr = record["podCidr"].as_str().expect("the podCIDR").to_string();
    let proxy_table = common::proxy_table(&service_range);
    assert_eq!(record["clusterCidr"], cluster_cidr.as_str());
    assert_eq!(record["serviceCidr"], service_range.as_str());
    let tables = record["nftTables"].as_array().expect("tables");
    assert!(tables.iter().any(|t| t == proxy_table.as_str()), "{record}");

    // SIGTERM: the process goes, what it set up stays (pods keep running and reachable).
    assert!(
        n.c.terminate(),
        "the server did not exit cleanly:\n{}",
        tail(&n.c.log(), 30)
    );
    assert!(
        nft_tables().contains(&format!("table ip {proxy_table}\n")),
        "{}",
        nft_tables()
    );
    assert!(routes_proto_83().contains(&cluster_cidr), "{}", routes_proto_83());
    assert!(local_routes().contains(&service_range), "{}", local_routes());
    let running = run(
        "docker",
        &["ps", "-q", "--filter", &format!("label=io.skiff.cluster={cluster}")],
    );
    assert!(!running.trim().is_empty(), "the pods stopped with the server");

    let decoy = Decoy::new(port_tag);
    let out = Command::new(skiff_bin())
        .args(["uninstall", "--data", "--data-dir"])
        .arg(&data_dir)
        .env("HOME", &data_dir)
        .output()
        .expect("skiff uninstall");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "uninstall failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        format!("removed: Docker network {network}"),
        format!("removed: nftables table ip {proxy_table}"),
        format!("removed: route local {service_range} dev lo table local"),
        format!("removed: {}", data_dir.display()),
        "skiff: uninstalled".to_string(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }

    assert!(
        containers_of(&cluster).is_empty(),
        "containers left: {:?}",
        containers_of(&cluster)
    );
    let tables = nft_tables();
    for t in record["nftTables"].as_array().into_iter().flatten() {
        let t = t.as_str().unwrap_or_default();
        // Another test's cluster may share the pod network's default table name.
        if t == proxy_table {
            assert!(!tables.contains(&format!("table ip {t}\n")), "{t} left: {tables}");
        }
    }
    let routes = routes_proto_83();
    assert!(!routes.contains(&cluster_cidr), "{routes}");
    assert!(!routes.contains(&pod_cidr), "{routes}");
    assert!(
        !local_routes().contains(&format!("local {service_range} ")),
        "{}",
        local_routes()
    );
    let networks = run("docker", &["network", "ls", "--format", "{{.Name}}"]);
    assert!(!networks.lines().any(|l| l == network), "{networks}");
    let forwarding = run("iptables", &["-w", "-S", "DOCKER-USER"]);
    assert!(!forwarding.contains(&pod_cidr), "{forwarding}");
    assert!(!data_dir.exists(), "the data dir is still there");

    // Another cluster's table and route are untouched.
    assert!(tables.contains(&format!("table ip {}\n", decoy.table)), "{tables}");
    assert!(routes.contains(&decoy.route), "{routes}");

    // Run again, nothing is left to do and nothing fails.
    let again = Command::new(skiff_bin())
        .args(["uninstall", "--data-dir"])
        .arg(&data_dir)
        .env("HOME", &data_dir)
        .output()
        .expect("skiff uninstall");
    assert!(again.status.success(), "{again:?}");
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(
        !again.contains("removed:") && again.contains("skiff: uninstalled"),
        "{again}"
    );
}
