//! The Job controller (upstream's `pkg/controller/job`): runs pods up to `parallelism` until
//! `completions` succeed (NonIndexed or Indexed), fails the Job past `backoffLimit` or
//! `activeDeadlineSeconds`, honours `suspend`, and reports active / ready / terminating /
//! succeeded / failed, startTime / completionTime and the conditions (SuccessCriteriaMet and
//! Complete, FailureTarget and Failed, Suspended) as upstream 1.33 does. It also deletes finished
//! Jobs after `ttlSecondsAfterFinished` (upstream's ttlafterfinished controller).
//!
//! Pods are counted from the live pod list (no tracking finalizer): a finished pod deleted by
//! hand before the Job finishes is not counted again, as the counts never go down.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};

pub const COMPONENT: &str = "job-controller";
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

pub async fn run(client: kube::Client, informers: crate::informers::SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let store = cu::spawn_owner_watch(Api::<Job>::all(client.clone()), queue.clone());
    let s = store.clone();
    // Pod events come from the process's shared pod informer (one watch for every controller).
    cu::on_changes(&informers.informer::<Pod>(), queue.clone(), move |p: &Pod| {
        cu::owner_keys(&s, &p.metadata, "Job", |j: &Job| {
            j.spec.as_ref().and_then(|s| s.selector.as_ref())
        })
    });
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
    };
    queue.run("job", |key| sync(&ctx, key)).await
}

fn condition_true(status: Option<&JobStatus>, t: &str) -> bool {
    status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
}

/// Complete or Failed.
pub fn is_finished(job: &Job) -> bool {
    condition_true(job.status.as_ref(), "Complete") || condition_true(job.status.as_ref(), "Failed")
}

fn new_condition(t: &str, status: &str, reason: &str, message: &str) -> JobCondition {
    let now = cu::now();
    JobCondition {
        type_: t.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_probe_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

/// Set a condition; an unchanged status keeps its times.
fn set_condition(s: &mut JobStatus, c: JobCondition) {
    let cs = s.conditions.get_or_insert_with(Vec::new);
    if let Some(cur) = cs.iter_mut().find(|x| x.type_ == c.type_) {
        if cur.status != c.status || cur.reason != c.reason || cur.message != c.message {
            let keep_transition = cur.status == c.status;
            let lt = cur.last_transition_time.clone();
            *cur = c;
            if keep_transition {
                cur.last_transition_time = lt;
            }
        }
    } else {
        cs.push(c);
    }
}

/// Compressed index list as upstream prints it: `0-2,4`.
pub fn format_indexes(set: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// Parse `0-2,4` back.
pub fn parse_indexes(s: &str) -> BTreeSet<i32> {
    let mut set = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    set.extend(a..=b);
                }
            }
            None => {
                if let Ok(v) = part.parse() {
                    set.insert(v);
                }
            }
        }
    }
    set
}

fn pod_index(p: &Pod) -> Option<i32> {
    let a = p.metadata.annotations.as_ref().and_then(|a| a.get(COMPLETION_INDEX));
    let l = p.metadata.labels.as_ref().and_then(|l| l.get(COMPLETION_INDEX));
    a.or(l)?.parse().ok()
}

/// Upstream's success policy: a rule holds when its indexes all succeeded, or when at least
/// `succeededCount` of them (of all indexes without a list) did.
pub fn success_policy_met(rules: &[k8s_openapi::api::batch::v1::SuccessPolicyRule], completed: &BTreeSet<i32>) -> bool {
    rules.iter().any(|r| match r.succeeded_indexes.as_deref() {
        Some(list) => {
            let wanted = parse_indexes(list);
            let done = wanted.intersection(completed).count();
            match r.succeeded_count {
                Some(n) => done as i32 >= n,
                None => done == wanted.len(),
            }
        }
        None => r.succeeded_count.is_some_and(|n| completed.len() as i32 >= n),
    })
}

/// How many pods should be active (upstream's `manageJob` arithmetic, NonIndexed).
pub fn want_active(completions: Option<i32>, parallelism: i32, succeeded: i32, active: i32) -> i32 {
    match completions {
        None => {
            if succeeded > 0 {
                active.min(parallelism)
            } else {
                parallelism
            }
        }
        Some(c) => (c - succeeded).clamp(0, parallelism),
    }
}

fn restart_total(pods: &[&Pod]) -> i32 {
    pods.iter()
        .filter(|p| matches!(cu::pod_phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum::<i32>()
                + s.init_container_statuses
                    .iter()
                    .flatten()
                    .map(|c| c.restart_count)
                    .sum::<i32>()
        })
        .sum()
}

/// Upstream's pod failure backoff: 10 s doubling per consecutive failure, at most 6 minutes.
pub fn backoff_delay(consecutive_failures: u32) -> Duration {
    if consecutive_failures == 0 {
        return Duration::ZERO;
    }
    let secs = 10u64.saturating_mul(1u64 << (consecutive_failures - 1).min(10));
    Duration::from_secs(secs.min(360))
}

/// When a pod finished: its containers' last termination, else its Ready condition change.
fn finish_time(p: &Pod) -> Option<jiff::Timestamp> {
    let st = p.status.as_ref()?;
    let containers = st
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0))
        .max();
    containers.or_else(|| {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
            .or_else(|| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
    })
}

/// How long to wait before replacing failed pods, if at all: failures since the last success
/// count as consecutive.
fn pod_backoff_remaining(pods: &[Pod], now: jiff::Timestamp) -> Option<Duration> {
    let last_success = pods
        .iter()
        .filter(|p| cu::pod_phase(p) == "Succeeded")
        .filter_map(finish_time)
        .max();
    let failures: Vec<jiff::Timestamp> = pods
        .iter()
        .filter(|p| cu::pod_phase(p) == "Failed")
        .filter_map(finish_time)
        .filter(|t| last_success.is_none_or(|s| *t > s))
        .collect();
    let last = failures.iter().max()?;
    let delay = backoff_delay(failures.len() as u32);
    let at = *last + jiff::SignedDuration::try_from(delay).ok()?;
    (at > now).then(|| Duration::from_millis(at.duration_since(now).as_millis().max(0) as u64 + 100))
}

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let Some(job) = jobs.get_opt(name).await? else {
        return Ok(None);
    };
    let now = jiff::Timestamp::now();
    if is_finished(&job) {
        return ttl(&jobs, &job, now).await;
    }
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let Some(spec) = job.spec.clone() else {
        return Ok(None);
    };
    // Another controller manages this Job.
    if spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != "kubernetes.io/job-controller")
    {
        return Ok(None);
    }
    let selector = cu::selector_of(spec.selector.as_ref());
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let all = pods_api.list(&ListParams::default()).await?.items;
    let pods = cu::claim(&pods_api, &job.metadata, "batch/v1", "Job", &selector, all)
        .await?
        .owned;

    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions;
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let old = job.status.clone().unwrap_or_default();

    let active: Vec<&Pod> = pods.iter().filter(|p| cu::is_pod_active(p)).collect();
    let terminating = pods
        .iter()
        .filter(|p| cu::is_pod_terminating(p) && !matches!(cu::pod_phase(p), "Succeeded" | "Failed"))
        .count() as i32;
    let mut completed_indexes = parse_indexes(old.completed_indexes.as_deref().unwrap_or(""));
    let succeeded_pods: Vec<&Pod> = pods.iter().filter(|p| cu::pod_phase(p) == "Succeeded").collect();
    if indexed {
        let limit = completions.unwrap_or(0);
        completed_indexes.extend(
            succeeded_pods
                .iter()
                .filter_map(|p| pod_index(p))
                .filter(|i| *i >= 0 && *i < limit),
        );
    }
    let succeeded = old.succeeded.unwrap_or(0).max(if indexed {
        completed_indexes.len() as i32
    } else {
        succeeded_pods.len() as i32
    });
    let failed_now = pods.iter().filter(|p| cu::pod_phase(p) == "Failed").count() as i32;
    let mut failed = old.failed.unwrap_or(0).max(failed_now);

    let mut status = old.clone();
    if status.start_time.is_none() && spec.suspend != Some(true) {
        status.start_time = Some(cu::now());
    }

    // Finished?
    let restart_on_failure = spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("OnFailure");
    let past_backoff_on_failure = restart_on_failure && {
        let r = restart_total(&active);
        if backoff_limit == 0 { r > 0 } else { r >= backoff_limit }
    };
    let exceeds_backoff = failed > backoff_limit;
    let deadline_at = match (spec.active_deadline_seconds, status.start_time.as_ref()) {
        (Some(secs), Some(st)) if spec.suspend != Some(true) => Some(st.0 + jiff::SignedDuration::from_secs(secs)),
        _ => None,
    };
    let failure = if exceeds_backoff || past_backoff_on_failure {
        Some(("BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    } else if deadline_at.is_some_and(|d| d <= now) {
        Some(("DeadlineExceeded", "Job was active longer than specified deadline"))
    } else {
        None
    };
    let by_policy = failure.is_none()
        && indexed
        && spec
            .success_policy
            .as_ref()
            .is_some_and(|p| success_policy_met(&p.rules, &completed_indexes));
    let complete = failure.is_none()
        && (by_policy
            || match completions {
                None => succeeded > 0 && active.is_empty(),
                Some(c) => succeeded >= c,
            });

    let mut again = None;
    if let Some((reason, message)) = failure {
        failed += delete_pods(ctx, &job, &pods_api, &active).await? as i32;
        set_condition(&mut status, new_condition("FailureTarget", "True", reason, message));
        set_condition(&mut status, new_condition("Failed", "True", reason, message));
        ctx.recorder.event(&job, "Warning", reason, message);
        status.active = None;
        status.ready = Some(0);
    } else if complete {
        delete_pods(ctx, &job, &pods_api, &active).await?;
        let (reason, msg) = if by_policy {
            ("SuccessPolicy", "Matched success policy rule")
        } else {
            ("CompletionsReached", "Reached expected number of succeeded pods")
        };
        set_condition(&mut status, new_condition("SuccessCriteriaMet", "True", reason, msg));
        set_condition(&mut status, new_condition("Complete", "True", reason, msg));
        status.completion_time = Some(cu::now());
        ctx.recorder.event(&job, "Normal", "Completed", "Job completed");
        status.active = None;
        status.ready = Some(0);
    } else {
        let suspended = spec.suspend == Some(true);
        let mut active_count = active.len() as i32;
        if suspended {
            active_count -= delete_pods(ctx, &job, &pods_api, &active).await? as i32;
            if !condition_true(Some(&status), "Suspended") {
                // The deadline starts over when the Job resumes.
                status.start_time = None;
            }
            set_condition(
                &mut status,
                new_condition("Suspended", "True", "JobSuspended", "Job suspended"),
            );
        } else {
            if condition_true(Some(&status), "Suspended") {
                set_condition(
                    &mut status,
                    new_condition("Suspended", "False", "JobResumed", "Job resumed"),
                );
            }
            // Failed pods are replaced after upstream's exponential backoff.
            let backoff = pod_backoff_remaining(&pods, now);
            // podReplacementPolicy Failed: replacements wait until terminating pods are gone.
            let wait_terminating = spec.pod_replacement_policy.as_deref() == Some("Failed") && terminating > 0;
            let may_create = backoff.is_none() && !wait_terminating;
            again = backoff;
            if indexed {
                if may_create {
                    active_count +=
                        manage_indexed(ctx, &job, &pods_api, &active, &completed_indexes, parallelism).await?;
                }
            } else {
                let want = want_active(completions, parallelism, succeeded, active_count);
                if active_count > want {
                    let victims = cu::pods_to_delete(&active, &active, (active_count - want) as usize);
                    active_count -= delete_pods(ctx, &job, &pods_api, &victims).await? as i32;
                } else if active_count < want && may_create {
                    active_count += create_pods(ctx, &job, &pods_api, (want - active_count) as usize, None).await?;
                }
            }
        }
        status.active = (active_count > 0).then_some(active_count);
        status.ready = Some(active.iter().filter(|p| cu::is_pod_ready(p)).count() as i32);
        let deadline_in =
            deadline_at.map(|d| Duration::from_millis(d.duration_since(now).as_millis().max(0) as u64 + 100));
        again = match (again, deadline_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    status.succeeded = (succeeded > 0).then_some(succeeded);
    status.failed = (failed > 0).then_some(failed);
    status.terminating = Some(terminating);
    if indexed {
        status.completed_indexes = Some(format_indexes(&completed_indexes));
    }
    status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    if job.status.as_ref() != Some(&status) {
        let mut updated = job.clone();
        updated.status = Some(status);
        let after = jobs.replace_status(name, &PostParams::default(), &updated).await?;
        if is_finished(&after) {
            return ttl(&jobs, &after, now).await;
        }
    }
    Ok(again)
}

/// Delete finished Jobs past `ttlSecondsAfterFinished`; otherwise when to look again.
async fn ttl(jobs: &Api<Job>, job: &Job, now: jiff::Timestamp) -> anyhow::Result<Option<Duration>> {
    let Some(secs) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
        return Ok(None);
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let status = job.status.clone().unwrap_or_default();
    let finished_at = status.completion_time.as_ref().map(|t| t.0).or_else(|| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| (c.type_ == "Failed" || c.type_ == "Complete") && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
    });
    let Some(at) = finished_at else {
        return Ok(None);
    };
    let expires = at + jiff::SignedDuration::from_secs(i64::from(secs));
    if expires > now {
        return Ok(Some(Duration::from_millis(
            expires.duration_since(now).as_millis().max(0) as u64 + 100,
        )));
    }
    let name = job.metadata.name.clone().unwrap_or_default();
    cu::delete_ignoring_missing(jobs, &name, &DeleteParams::background()).await?;
    Ok(None)
}

async fn delete_pods(ctx: &Ctx, job: &Job, pods_api: &Api<Pod>, pods: &[&Pod]) -> anyhow::Result<usize> {
    let mut n = 0;
    for p in pods {
        let pname = p.metadata.name.clone().unwrap_or_default();
        match pods_api.delete(&pname, &DeleteParams::background()).await {
            Ok(_) => {
                n += 1;
                ctx.recorder
                    .event(job, "Normal", "SuccessfulDelete", format!("Deleted pod: {pname}"));
            }
            Err(e) if cu::is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

async fn create_pods(ctx: &Ctx, job: &Job, pods_api: &Api<Pod>, n: usize, index: Option<i32>) -> anyhow::Result<i32> {
    let Some(spec) = job.spec.as_ref() else {
        return Ok(0);
    };
    let name = job.metadata.name.clone().unwrap_or_default();
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let mut template = spec.template.clone();
    let mut prefix = cu::pod_name_prefix(&name);
    if let Some(i) = index {
        let idx = i.to_string();
        let meta = template.metadata.get_or_insert_with(Default::default);
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(COMPLETION_INDEX.into(), idx.clone());
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(COMPLETION_INDEX.into(), idx.clone());
        if let Some(ps) = template.spec.as_mut() {
            ps.hostname = Some(format!("{name}-{idx}"));
            let env = EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                    }),
                    ..Default::default()
                }),
            };
            for c in ps.containers.iter_mut().chain(ps.init_containers.iter_mut().flatten()) {
                let envs = c.env.get_or_insert_with(Vec::new);
                if !envs.iter().any(|e| e.name == env.name) {
                    envs.push(env.clone());
                }
            }
        }
        prefix = cu::pod_name_prefix(&format!("{name}-{idx}"));
    }
    let owner = cu::new_controller_ref(&job.metadata, "batch/v1", "Job");
    let pod = cu::pod_from_template(&template, &prefix, Some(owner), &ns);
    let mut created = 0;
    for _ in 0..n.min(cu::BURST_REPLICAS) {
        match pods_api.create(&PostParams::default(), &pod).await {
            Ok(p) => {
                created += 1;
                let msg = format!("Created pod: {}", p.metadata.name.unwrap_or_default());
                ctx.recorder.event(job, "Normal", "SuccessfulCreate", &msg);
            }
            Err(e) => {
                let msg = format!("Error creating: {}", crate::replicaset::api_message(&e));
                ctx.recorder.event(job, "Warning", "FailedCreate", &msg);
                return Err(e.into());
            }
        }
    }
    Ok(created)
}

/// Indexed mode: one pod per index not yet completed, lowest first, up to parallelism.
async fn manage_indexed(
    ctx: &Ctx,
    job: &Job,
    pods_api: &Api<Pod>,
    active: &[&Pod],
    completed: &BTreeSet<i32>,
    parallelism: i32,
) -> anyhow::Result<i32> {
    let completions = job.spec.as_ref().and_then(|s| s.completions).unwrap_or(0);
    let running: BTreeSet<i32> = active.iter().filter_map(|p| pod_index(p)).collect();
    let mut room = parallelism - active.len() as i32;
    let mut created = 0;
    for i in 0..completions {
        if room <= 0 {
            break;
        }
        if completed.contains(&i) || running.contains(&i) {
            continue;
        }
        created += create_pods(ctx, job, pods_api, 1, Some(i)).await?;
        room -= 1;
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lists_round_trip() {
        let set: BTreeSet<i32> = [0, 1, 2, 4, 6, 7].into();
        assert_eq!(format_indexes(&set), "0-2,4,6-7");
        assert_eq!(parse_indexes("0-2,4,6-7"), set);
        assert_eq!(format_indexes(&BTreeSet::new()), "");
    }

    #[test]
    fn success_policy_rules() {
        use k8s_openapi::api::batch::v1::SuccessPolicyRule;
        let done: BTreeSet<i32> = [0, 2, 3].into();
        let rule = |idx: Option<&str>, n: Option<i32>| SuccessPolicyRule {
            succeeded_indexes: idx.map(str::to_string),
            succeeded_count: n,
        };
        assert!(success_policy_met(&[rule(Some("0,2-3"), None)], &done));
        assert!(!success_policy_met(&[rule(Some("0-3"), None)], &done));
        assert!(success_policy_met(&[rule(Some("0-3"), Some(3))], &done));
        assert!(success_policy_met(&[rule(None, Some(2))], &done));
        assert!(!success_policy_met(&[rule(None, Some(4))], &done));
    }

    #[test]
    fn backoff_doubles_up_to_six_minutes() {
        assert_eq!(backoff_delay(0), Duration::ZERO);
        assert_eq!(backoff_delay(1), Duration::from_secs(10));
        assert_eq!(backoff_delay(3), Duration::from_secs(40));
        assert_eq!(backoff_delay(7), Duration::from_secs(360));
        assert_eq!(backoff_delay(40), Duration::from_secs(360));
    }

    #[test]
    fn active_pods_wanted() {
        // completions unset: parallelism until one succeeds, then no new pods.
        assert_eq!(want_active(None, 2, 0, 0), 2);
        assert_eq!(want_active(None, 2, 1, 1), 1);
        // completions 5, parallelism 2.
        assert_eq!(want_active(Some(5), 2, 0, 0), 2);
        assert_eq!(want_active(Some(5), 2, 4, 1), 1);
        assert_eq!(want_active(Some(5), 2, 5, 0), 0);
    }
}
