//! The YAML examples of the seed documents, as written there, shared by the tests that apply them.

/// Seed 003's DaemonSet: fluentd collecting the node's logs through two hostPath volumes.
pub const DAEMONSET_FLUENTD: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: fluentd-elasticsearch
  namespace: kube-system
  labels:
    k8s-app: fluentd-logging
spec:
  selector:
    matchLabels:
      name: fluentd-elasticsearch
  template:
    metadata:
      labels:
        name: fluentd-elasticsearch
    spec:
      tolerations:
      - key: node-role.kubernetes.io/master
        effect: NoSchedule
      containers:
      - name: fluentd-elasticsearch
        image: k8s.gcr.io/fluentd-elasticsearch:1.20
        resources:
          limits:
            memory: 200Mi
          requests:
            cpu: 100m
            memory: 200Mi
        volumeMounts:
        - name: varlog
          mountPath: /var/log
        - name: varlibdockercontainers
          mountPath: /var/lib/docker/containers
          readOnly: true
      terminationGracePeriodSeconds: 30
      volumes:
      - name: varlog
        hostPath:
          path: /var/log
      - name: varlibdockercontainers
        hostPath:
          path: /var/lib/docker/containers
"#;

/// Seed 003's StatefulSet: two nginx pods, `web-0` and `web-1`, behind the Service `nginx`.
pub const STATEFULSET_WEB: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: "nginx"
  replicas: 2
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.9.1
        ports:
        - containerPort: 80
          name: web
"#;

/// The headless Service seed 003's StatefulSet names as its `serviceName` (the seed describes
/// it without its YAML).
pub const NGINX_HEADLESS_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: nginx
  labels: {app: nginx}
spec:
  clusterIP: None
  selector: {app: nginx}
  ports:
  - {name: web, port: 80}
"#;

/// Seed 003's StatefulSet behind its headless Service, with busybox's httpd for nginx (no image can
/// be pulled here): each container runs `sh -c SCRIPT`, and pods stop within a second. The
/// container's last field is `ports` and the spec's is `template`, so a test may append more of
/// either.
pub fn statefulset_web_on_busybox(script: &str) -> String {
    let set = replace_once(
        STATEFULSET_WEB,
        "    spec:\n      containers:\n",
        "    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n",
    );
    let set = replace_once(
        &set,
        "        image: nginx:1.9.1\n",
        &format!(
            "        image: busybox:latest\n        imagePullPolicy: IfNotPresent\n        command: [\"sh\", \"-c\", \"{script}\"]\n"
        ),
    );
    format!("{NGINX_HEADLESS_SERVICE}---\n{set}")
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} in {text}");
    text.replacen(from, to, 1)
}

/// Seed 003's CronJob, in the removed `batch/v1beta1` it is written in.
pub const CRONJOB_V1BETA1: &str = r#"apiVersion: batch/v1beta1
kind: CronJob
metadata:
  name: hello
spec:
  schedule: "*/1 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: hello
            image: busybox
            args:
            - /bin/sh
            - -c
            - date; echo Hello from the Kubernetes cluster
          restartPolicy: OnFailure
"#;
