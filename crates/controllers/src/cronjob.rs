//! The CronJob controller (upstream's `pkg/controller/cronjob`, the v2 controller): creates a
//! Job `<cronjob>-<scheduled time in minutes since the epoch>` for the most recent missed
//! schedule time (within `startingDeadlineSeconds`), honours `suspend`, `timeZone` and
//! `concurrencyPolicy` (Allow / Forbid / Replace), tracks `status.active`, `lastScheduleTime`
//! and `lastSuccessfulTime`, and deletes finished Jobs beyond the history limits.

use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::job::is_finished;

pub const COMPONENT: &str = "cronjob-controller";
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Requeue a little after the next schedule time, as upstream's `nextScheduleDelta`.
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    cu::spawn_owner_watch(Api::<CronJob>::all(client.clone()), queue.clone());
    cu::spawn_watch(Api::<Job>::all(client.clone()), queue.clone(), |j: &Job| {
        cu::controller_key(&j.metadata, "CronJob").into_iter().collect()
    });
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
    };
    queue.run("cronjob", |key| sync(&ctx, key)).await
}

/// A parsed schedule in a time zone, as upstream's cron library (`ParseStandard`) reads it: five
/// fields or a descriptor such as `@hourly` (day-of-month OR day-of-week when both are restricted),
/// `@every DURATION`, and a `TZ=` / `CRON_TZ=` prefix. What it accepts is exactly what the API's
/// validation accepts (`validate_cron_schedule`), so no stored CronJob is refused here.
pub struct Schedule {
    kind: Kind,
    tz: jiff::tz::TimeZone,
}

enum Kind {
    Cron(Box<croner::Cron>),
    /// `@every`: robfig/cron's ConstantDelaySchedule, whole seconds, at least one.
    Every(jiff::SignedDuration),
    /// Days of the month that no month has (`0 0 31 4 *`, `0 0 30 2 *`): upstream's cron library
    /// gives up after five years and the schedule never runs.
    Never,
}

/// Upstream's cron library reads a range that starts with `*` or `?` (`*-5`, `?-3/2`) as the
/// whole range, ignoring what follows the hyphen, a list with such a part (`*,6`) as `*`, and
/// takes `+5` for `5` and a step past the range (`*/90`) for the range's start; the API accepts such
/// fields, so they are rewritten (`*` keeping any step, `5`) for the cron library here, which
/// refuses them.
fn star_ranges(expr: &str) -> String {
    // Each field's bounds: a step past the range leaves only its start.
    const BOUNDS: [(u64, u64); 5] = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)];
    expr.split_whitespace()
        .enumerate()
        .map(|(i, field)| {
            let (min, max) = BOUNDS.get(i).copied().unwrap_or((0, 59));
            let parts = field
                .split(',')
                .map(|part| {
                    // Numbers are Go's strconv.Atoi there, which takes a leading `+`.
                    let part = part.replace("-+", "-").replace("/+", "/");
                    let part = part.strip_prefix('+').unwrap_or(&part);
                    let (range, step) = match part.split_once('/') {
                        Some((r, s)) => (r, Some(s)),
                        None => (part, None),
                    };
                    let low = range.split('-').next().unwrap_or(range);
                    let range = if range.contains('-') && (low == "*" || low == "?") {
                        "*"
                    } else {
                        range
                    };
                    if step.and_then(|s| s.parse::<u64>().ok()).is_some_and(|s| s > max - min) {
                        return if range == "*" || range == "?" {
                            min.to_string()
                        } else {
                            low.to_string()
                        };
                    }
                    match step {
                        Some(s) => format!("{range}/{s}"),
                        None => range.to_string(),
                    }
                })
                .collect::<Vec<_>>();
            // A list with a whole-range part (`*,6`) is the whole range, star included.
            if parts.iter().any(|p| matches!(p.as_str(), "*" | "?" | "*/1" | "?/1")) {
                return "*".to_string();
            }
            parts.join(",")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether the schedule names only days that its months do not have, with every day of the
/// week allowed (a restricted day of the week would run it on those days). Searching such a
/// schedule walks day by day to the cron library's year 5000: over a second each time the
/// controller asks, for a schedule the API accepts.
fn never_fires(cron: &croner::Cron) -> bool {
    const ALL: u8 = 1;
    let set = |c: &croner::Cron, field: u8, pos: u16| {
        let component = match field {
            0 => &c.pattern.days,
            1 => &c.pattern.months,
            _ => &c.pattern.days_of_week,
        };
        component.is_bit_set(pos, ALL).unwrap_or(false)
    };
    let every_weekday = (0..=6).all(|d| set(cron, 2, d));
    let days: Vec<u16> = (1..=31).filter(|&d| set(cron, 0, d)).collect();
    if !every_weekday || days.is_empty() {
        return false;
    }
    const LAST_DAY: [u16; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    !(1..=12u16).any(|m| set(cron, 1, m) && days.iter().any(|&d| d <= LAST_DAY[usize::from(m - 1)]))
}

impl Schedule {
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, String> {
        skiff_api::validation::validate_cron_schedule(schedule)?;
        let zone = |name: &str| jiff::tz::TimeZone::get(name).map_err(|e| format!("unknown time zone {name}: {e}"));
        let mut tz = match time_zone {
            Some(name) => zone(name)?,
            None => jiff::tz::TimeZone::UTC,
        };
        let mut s = schedule.trim();
        for prefix in ["TZ=", "CRON_TZ="] {
            if let Some((name, rest)) = s.strip_prefix(prefix).and_then(|r| r.split_once(' ')) {
                tz = zone(name)?;
                s = rest.trim();
            }
        }
        if let Some(every) = s.strip_prefix("@every ") {
            let d = skiff_api::validation::parse_go_duration(every.trim())
                .ok_or_else(|| format!("failed to parse duration {s}"))?;
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX).max(1);
            return Ok(Schedule {
                kind: Kind::Every(jiff::SignedDuration::from_secs(secs)),
                tz,
            });
        }
        let expr = match s {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let cron = croner::Cron::from_str(&star_ranges(expr)).map_err(|e| e.to_string())?;
        if never_fires(&cron) {
            return Ok(Schedule { kind: Kind::Never, tz });
        }
        Ok(Schedule {
            kind: Kind::Cron(Box::new(cron)),
            tz,
        })
    }

    /// The first activation strictly after `t`.
    pub fn next(&self, t: jiff::Timestamp) -> Option<jiff::Timestamp> {
        let cron = match &self.kind {
            Kind::Cron(cron) => cron,
            // Upstream: the time rounded down to the second, plus the delay.
            Kind::Every(d) => return jiff::Timestamp::from_second(t.as_second()).ok()?.checked_add(*d).ok(),
            Kind::Never => return None,
        };
        let civil = t.to_zoned(self.tz.clone()).datetime();
        let naive = chrono::NaiveDate::from_ymd_opt(
            i32::from(civil.year()),
            u32::try_from(civil.month()).ok()?,
            u32::try_from(civil.day()).ok()?,
        )?
        .and_hms_opt(
            u32::try_from(civil.hour()).ok()?,
            u32::try_from(civil.minute()).ok()?,
            u32::try_from(civil.second()).ok()?,
        )?
        .and_utc();
        let next = cron.find_next_occurrence(&naive, false).ok()?;
        use chrono::{Datelike, Timelike};
        let dt = jiff::civil::DateTime::new(
            i16::try_from(next.year()).ok()?,
            i8::try_from(next.month()).ok()?,
            i8::try_from(next.day()).ok()?,
            i8::try_from(next.hour()).ok()?,
            i8::try_from(next.minute()).ok()?,
            0,
            0,
        )
        .ok()?;
        let ts = dt.to_zoned(self.tz.clone()).ok()?.timestamp();
        // A DST gap can map a civil time before `t`; look further then.
        if ts <= t {
            return self.next(t + jiff::SignedDuration::from_secs(60));
        }
        Some(ts)
    }
}

/// Upstream's `mostRecentScheduleTime`: (earliest time considered, most recent missed schedule
/// time, how many were missed).
pub fn most_recent_schedule_time(
    cj: &CronJob,
    now: jiff::Timestamp,
    sched: &Schedule,
    include_starting_deadline: bool,
) -> (jiff::Timestamp, Option<jiff::Timestamp>, i64) {
    let mut earliest = cj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .or(cj.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    if include_starting_deadline && let Some(sds) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds) {
        let deadline = now - jiff::SignedDuration::from_secs(sds);
        if deadline > earliest {
            earliest = deadline;
        }
    }
    let Some(t1) = sched.next(earliest) else {
        return (earliest, None, 0);
    };
    if now < t1 {
        return (earliest, None, 0);
    }
    let Some(t2) = sched.next(t1) else {
        return (earliest, Some(t1), 1);
    };
    if now < t2 {
        return (earliest, Some(t1), 1);
    }
    // Walk on; stop counting exactly past a bound and take the latest before `now`.
    let mut missed = 2i64;
    let mut recent = t2;
    while let Some(t) = sched.next(recent) {
        if t > now {
            break;
        }
        recent = t;
        missed += 1;
        if missed > 100_000 {
            break;
        }
    }
    (earliest, Some(recent), missed)
}

/// Upstream's `getJobName` time part: the scheduled time in minutes since the epoch.
pub fn job_name(cj_name: &str, scheduled: jiff::Timestamp) -> String {
    format!("{cj_name}-{}", scheduled.as_second().div_euclid(60))
}

fn job_condition(j: &Job) -> Option<&'static str> {
    let cs = j.status.as_ref()?.conditions.as_ref()?;
    if cs.iter().any(|c| c.type_ == "Complete" && c.status == "True") {
        Some("Complete")
    } else if cs.iter().any(|c| c.type_ == "Failed" && c.status == "True") {
        Some("Failed")
    } else {
        None
    }
}

fn job_ref(j: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: j.metadata.name.clone(),
        namespace: j.metadata.namespace.clone(),
        uid: j.metadata.uid.clone(),
        resource_version: j.metadata.resource_version.clone(),
        ..Default::default()
    }
}

fn in_active(cj: &CronJob, uid: Option<&str>) -> bool {
    cj.status
        .as_ref()
        .and_then(|s| s.active.as_ref())
        .is_some_and(|a| a.iter().any(|r| r.uid.as_deref() == uid))
}

fn remove_active(cj: &mut CronJob, uid: Option<&str>) {
    if let Some(a) = cj.status.as_mut().and_then(|s| s.active.as_mut()) {
        a.retain(|r| r.uid.as_deref() != uid);
    }
}

fn requeue_after(cj: &CronJob, sched: &Schedule, now: jiff::Timestamp) -> Option<Duration> {
    let (earliest, recent, _) = most_recent_schedule_time(cj, now, sched, false);
    let base = recent.unwrap_or(earliest);
    let next = sched.next(base)?;
    let d = next.duration_since(now);
    Some(Duration::from_millis(d.as_millis().max(0) as u64) + NEXT_SCHEDULE_DELTA)
}

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let cjs: Api<CronJob> = Api::namespaced(ctx.client.clone(), ns);
    let Some(orig) = cjs.get_opt(name).await? else {
        return Ok(None);
    };
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let uid = orig.metadata.uid.clone();
    let jobs: Vec<Job> = jobs_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|j| {
            cu::controller_ref(&j.metadata).is_some_and(|c| c.kind == "CronJob" && Some(&c.uid) == uid.as_ref())
        })
        .collect();
    let mut cj = orig.clone();
    let again = sync_cronjob(ctx, &mut cj, &jobs, &jobs_api).await;
    cleanup_finished(ctx, &mut cj, &jobs, &jobs_api).await?;
    if cj.status != orig.status {
        cjs.replace_status(name, &PostParams::default(), &cj).await?;
    }
    again
}

async fn sync_cronjob(
    ctx: &Ctx,
    cj: &mut CronJob,
    jobs: &[Job],
    jobs_api: &Api<Job>,
) -> anyhow::Result<Option<Duration>> {
    // Reconcile the active list with the Jobs that exist.
    let active: Vec<ObjectReference> = cj.status.as_ref().and_then(|s| s.active.clone()).unwrap_or_default();
    for r in &active {
        if jobs.iter().any(|j| j.metadata.uid == r.uid) {
            continue;
        }
        let jname = r.name.clone().unwrap_or_default();
        if jobs_api.get_opt(&jname).await?.is_none() {
            ctx.recorder.event(
                &*cj,
                "Normal",
                "MissingJob",
                format!("Active job went missing: {jname}"),
            );
            remove_active(cj, r.uid.as_deref());
        }
    }
    for j in jobs {
        let juid = j.metadata.uid.as_deref();
        let jname = j.metadata.name.clone().unwrap_or_default();
        let found = in_active(cj, juid);
        if !found && !is_finished(j) {
            let msg = format!("Saw a job that the controller did not create or forgot: {jname}");
            ctx.recorder.event(&*cj, "Warning", "UnexpectedJob", &msg);
        } else if found && let Some(cond) = job_condition(j) {
            remove_active(cj, juid);
            let msg = format!("Saw completed job: {jname}, condition: {cond}");
            ctx.recorder.event(&*cj, "Normal", "SawCompletedJob", &msg);
        }
        if job_condition(j) == Some("Complete")
            && let Some(done) = j.status.as_ref().and_then(|s| s.completion_time.clone())
        {
            let status = cj.status.get_or_insert_with(Default::default);
            if status.last_successful_time.as_ref().is_none_or(|t| t.0 < done.0) {
                status.last_successful_time = Some(done);
            }
        }
    }
    if cj.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let spec = cj.spec.clone().unwrap_or_default();
    if let Some(tz) = spec.time_zone.as_deref()
        && jiff::tz::TimeZone::get(tz).is_err()
    {
        let msg = format!("invalid timeZone: {tz:?}: unknown time zone {tz}");
        ctx.recorder.event(&*cj, "Warning", "UnknownTimeZone", &msg);
        return Ok(None);
    }
    let sched = match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("unparseable schedule: {:?} : {e}", spec.schedule);
            ctx.recorder.event(&*cj, "Warning", "UnparseableSchedule", &msg);
            return Ok(None);
        }
    };
    if spec.suspend == Some(true) {
        return Ok(None);
    }
    let now = jiff::Timestamp::now();
    let after = requeue_after(cj, &sched, now);
    let (_, scheduled, missed) = most_recent_schedule_time(cj, now, &sched, true);
    if missed > 100 {
        let msg = format!(
            "too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew"
        );
        ctx.recorder.event(&*cj, "Warning", "TooManyMissedTimes", &msg);
    }
    let Some(scheduled) = scheduled else {
        return Ok(after);
    };
    if let Some(sds) = spec.starting_deadline_seconds
        && scheduled + jiff::SignedDuration::from_secs(sds) < now
    {
        let msg = format!(
            "Missed scheduled time to start a job: {}",
            scheduled.strftime("%a, %d %b %Y %H:%M:%S %z")
        );
        ctx.recorder.event(&*cj, "Warning", "MissSchedule", &msg);
        return Ok(after);
    }
    let cj_name = cj.metadata.name.clone().unwrap_or_default();
    let name = job_name(&cj_name, scheduled);
    let already = cj
        .status
        .as_ref()
        .and_then(|s| s.active.as_ref())
        .is_some_and(|a| a.iter().any(|r| r.name.as_deref() == Some(name.as_str())))
        || cj
            .status
            .as_ref()
            .and_then(|s| s.last_schedule_time.as_ref())
            .map(|t| t.0)
            == Some(scheduled);
    if already {
        return Ok(after);
    }
    let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
    let active_now: Vec<ObjectReference> = cj.status.as_ref().and_then(|s| s.active.clone()).unwrap_or_default();
    if policy == "Forbid" && !active_now.is_empty() {
        ctx.recorder.event(
            &*cj,
            "Normal",
            "JobAlreadyActive",
            "Not starting job because prior execution is running and concurrency policy is Forbid",
        );
        return Ok(after);
    }
    if policy == "Replace" {
        for r in &active_now {
            let jname = r.name.clone().unwrap_or_default();
            cu::delete_ignoring_missing(jobs_api, &jname, &DeleteParams::background()).await?;
            ctx.recorder
                .event(&*cj, "Normal", "SuccessfulDelete", format!("Deleted job {jname}"));
            remove_active(cj, r.uid.as_deref());
        }
    }
    let job = job_from_template(cj, scheduled, &sched);
    let created = match jobs_api.create(&PostParams::default(), &job).await {
        Ok(j) => j,
        Err(e) if cu::is_already_exists(&e) => return Ok(after),
        Err(e) => {
            let msg = format!("Error creating job: {}", crate::replicaset::api_message(&e));
            ctx.recorder.event(&*cj, "Warning", "FailedCreate", &msg);
            return Err(e.into());
        }
    };
    ctx.recorder
        .event(&*cj, "Normal", "SuccessfulCreate", format!("Created job {name}"));
    let status = cj.status.get_or_insert_with(Default::default);
    status.active.get_or_insert_with(Vec::new).push(job_ref(&created));
    status.last_schedule_time = Some(Time(scheduled));
    Ok(after)
}

/// Upstream's `getJobFromTemplate2`.
fn job_from_template(cj: &CronJob, scheduled: jiff::Timestamp, sched: &Schedule) -> Job {
    let spec = cj.spec.clone().unwrap_or_default();
    let tmeta = spec.job_template.metadata.clone().unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    let stamp = scheduled
        .to_zoned(sched.tz.clone())
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string();
    let stamp = if stamp.ends_with("+00:00") {
        format!("{}Z", stamp.trim_end_matches("+00:00"))
    } else {
        stamp
    };
    annotations.insert(SCHEDULED_TIMESTAMP.into(), stamp);
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(cj.metadata.name.as_deref().unwrap_or_default(), scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels: tmeta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![cu::new_controller_ref(&cj.metadata, "batch/v1", "CronJob")]),
            ..Default::default()
        },
        spec: spec.job_template.spec.clone(),
        status: None,
    }
}

/// Upstream's `cleanupFinishedJobs`: keep the newest successful / failed Jobs up to the limits.
async fn cleanup_finished(ctx: &Ctx, cj: &mut CronJob, jobs: &[Job], jobs_api: &Api<Job>) -> anyhow::Result<()> {
    let spec = cj.spec.clone().unwrap_or_default();
    let start = |j: &Job| j.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
    for (kind, limit) in [
        ("Complete", spec.successful_jobs_history_limit),
        ("Failed", spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut finished: Vec<&Job> = jobs
            .iter()
            .filter(|j| job_condition(j) == Some(kind) && j.metadata.deletion_timestamp.is_none())
            .collect();
        let excess = finished.len() as i64 - i64::from(limit);
        if excess <= 0 {
            continue;
        }
        finished.sort_by(|a, b| {
            start(a)
                .cmp(&start(b))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        for j in finished.into_iter().take(excess as usize) {
            let jname = j.metadata.name.clone().unwrap_or_default();
            cu::delete_ignoring_missing(jobs_api, &jname, &DeleteParams::background()).await?;
            ctx.recorder
                .event(&*cj, "Normal", "SuccessfulDelete", format!("Deleted job {jname}"));
            remove_active(cj, j.metadata.uid.as_deref());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{CronJobSpec, CronJobStatus};

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn next_times_follow_the_schedule() {
        let s = Schedule::parse("*/1 * * * *", None).unwrap();
        assert_eq!(s.next(ts("2024-01-01T00:00:00Z")), Some(ts("2024-01-01T00:01:00Z")));
        assert_eq!(s.next(ts("2024-01-01T00:00:30Z")), Some(ts("2024-01-01T00:01:00Z")));
        let h = Schedule::parse("@hourly", None).unwrap();
        assert_eq!(h.next(ts("2024-01-01T10:15:00Z")), Some(ts("2024-01-01T11:00:00Z")));
        // Mondays only: a star day-of-month means day-of-week alone decides.
        let m = Schedule::parse("0 9 * * 1", None).unwrap();
        assert_eq!(m.next(ts("2024-01-03T00:00:00Z")), Some(ts("2024-01-08T09:00:00Z")));
        // Both restricted: either matches (the 15th, or a Monday).
        let either = Schedule::parse("0 0 15 * 1", None).unwrap();
        assert_eq!(
            either.next(ts("2024-01-09T00:00:00Z")),
            Some(ts("2024-01-15T00:00:00Z"))
        );
        assert_eq!(
            either.next(ts("2024-01-15T00:00:00Z")),
            Some(ts("2024-01-22T00:00:00Z"))
        );
    }

    #[test]
    fn time_zones_shift_the_schedule() {
        let s = Schedule::parse("0 9 * * *", Some("Asia/Shanghai")).unwrap();
        assert_eq!(s.next(ts("2024-01-01T00:00:00Z")), Some(ts("2024-01-01T01:00:00Z")));
        assert!(Schedule::parse("0 9 * * *", Some("Not/AZone")).is_err());
    }

    #[test]
    fn bad_schedules_are_rejected() {
        assert!(Schedule::parse("* * * *", None).is_err());
        assert!(Schedule::parse("0 * * * * *", None).is_err());
        assert!(Schedule::parse("@every 5x", None).is_err());
        assert!(Schedule::parse("61 * * * *", None).is_err());
    }

    #[test]
    fn every_and_tz_prefixes_as_validation_accepts_them() {
        let every = Schedule::parse("@every 1h30m", None).unwrap();
        assert_eq!(
            every.next(ts("2024-01-01T00:00:00.700Z")),
            Some(ts("2024-01-01T01:30:00Z"))
        );
        // Below a second: one second, as upstream.
        let fast = Schedule::parse("@every 5ms", None).unwrap();
        assert_eq!(fast.next(ts("2024-01-01T00:00:00Z")), Some(ts("2024-01-01T00:00:01Z")));
        let tz = Schedule::parse("CRON_TZ=Asia/Shanghai 0 9 * * *", None).unwrap();
        assert_eq!(tz.next(ts("2024-01-01T00:00:00Z")), Some(ts("2024-01-01T01:00:00Z")));
        // Whatever validation accepts, the controller can run.
        for s in ["@every 1h30m", "@every 5µs", "5/15 0 1 1 0", "@weekly", "TZ=UTC @daily"] {
            assert_eq!(skiff_api::validation::validate_cron_schedule(s), Ok(()), "{s}");
            assert!(Schedule::parse(s, None).is_ok(), "{s}");
        }
    }

    fn cj(created: &str, last: Option<&str>, sds: Option<i64>) -> CronJob {
        CronJob {
            metadata: ObjectMeta {
                name: Some("hello".into()),
                creation_timestamp: Some(Time(ts(created))),
                ..Default::default()
            },
            spec: Some(CronJobSpec {
                schedule: "*/1 * * * *".into(),
                starting_deadline_seconds: sds,
                ..Default::default()
            }),
            status: Some(CronJobStatus {
                last_schedule_time: last.map(|l| Time(ts(l))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn most_recent_missed_time() {
        let s = Schedule::parse("*/1 * * * *", None).unwrap();
        let c = cj("2024-01-01T00:00:10Z", None, None);
        let (_, t, n) = most_recent_schedule_time(&c, ts("2024-01-01T00:00:50Z"), &s, true);
        assert_eq!((t, n), (None, 0));
        let (_, t, n) = most_recent_schedule_time(&c, ts("2024-01-01T00:01:05Z"), &s, true);
        assert_eq!((t, n), (Some(ts("2024-01-01T00:01:00Z")), 1));
        let (_, t, n) = most_recent_schedule_time(&c, ts("2024-01-01T00:05:30Z"), &s, true);
        assert_eq!((t, n), (Some(ts("2024-01-01T00:05:00Z")), 5));
        // A starting deadline narrows the window.
        let c = cj("2024-01-01T00:00:10Z", None, Some(10));
        let (_, t, _) = most_recent_schedule_time(&c, ts("2024-01-01T00:05:30Z"), &s, true);
        assert_eq!(t, None);
        // The last schedule time is the start of the window.
        let c = cj("2024-01-01T00:00:10Z", Some("2024-01-01T00:05:00Z"), None);
        let (_, t, _) = most_recent_schedule_time(&c, ts("2024-01-01T00:05:30Z"), &s, true);
        assert_eq!(t, None);
        assert_eq!(
            requeue_after(&c, &s, ts("2024-01-01T00:05:30Z")),
            Some(Duration::from_millis(30_100))
        );
    }

    #[test]
    fn job_names_use_minutes_since_epoch() {
        assert_eq!(job_name("hello", ts("2024-01-01T00:01:00Z")), "hello-28401121");
    }

    /// Found by fuzzing: a schedule on a day its months lack made every `next` walk to the cron
    /// library's year 5000 (over a second per call); it now never runs at once, as upstream's.
    #[test]
    fn schedules_on_days_their_months_lack_never_run() {
        for schedule in [
            "0 0 31 4,6 *",
            "0 0 30 2 *",
            "0 0 31 2,4,6,9,11 *",
            "0 0 30,31 FEB *",
            "0 0 31 4 *,6",
        ] {
            let s = Schedule::parse(schedule, None).unwrap();
            let started = std::time::Instant::now();
            assert_eq!(s.next(ts("2024-01-01T00:00:00Z")), None, "{schedule}");
            assert!(started.elapsed() < std::time::Duration::from_millis(100), "{schedule}");
        }
        // Every one of these does run.
        for (schedule, next) in [
            ("0 0 29 2 *", "2024-02-29T00:00:00Z"),
            ("0 0 31 4,5 *", "2024-05-31T00:00:00Z"),
            ("0 0 31 4 1", "2024-04-01T00:00:00Z"),
            // Found by fuzzing too: `*-1` is `*` for upstream's parser (the API accepted it, the
            // cron library refused it, so the CronJob never ran).
            ("*/5 * *-1 * *", "2024-01-01T00:00:00Z"),
            ("0 0 ?-3/2 * *", "2024-01-01T00:00:00Z"),
            ("0 0 30 +2-+3 *", "2024-03-30T00:00:00Z"),
            ("0 0 30 4 *,6", "2024-04-30T00:00:00Z"),
            ("*/854775807 * * * *", "2024-01-01T00:00:00Z"),
            ("5 3-9/100 * * *", "2024-01-01T03:05:00Z"),
        ] {
            let s = Schedule::parse(schedule, None).unwrap();
            assert_eq!(s.next(ts("2023-12-31T23:59:00Z")), Some(ts(next)), "{schedule}");
        }
    }

    /// Any schedule the API accepts is one the controller can use: it parses, and the next
    /// activation (from a few instants, DST changes included) comes back at once, later than
    /// the instant asked about, or as none.
    #[test]
    fn fuzz_cron_schedules() {
        use skiff_fuzz::proptest::prelude::*;
        let seeds = [
            "*/5 * * * *",
            "0 0 * * 0",
            "@hourly",
            "@every 1h30m",
            "TZ=UTC 0 12 1-15/2 JAN-MAR MON-FRI",
            "59 23 31 12 7",
            "1,2,3 * * * *",
            "0 0 30 2 *",
            "0 0 29 2 *",
            "30 2 * * *",
            "@yearly",
            "0 0 31 4,6 *",
        ];
        let zones = vec![
            None,
            Some("UTC"),
            Some("Europe/Berlin"),
            Some("America/New_York"),
            Some("Australia/Lord_Howe"),
        ];
        let instants = vec![
            "2024-01-01T00:00:00Z",
            "2024-03-31T00:59:59Z",
            "2024-11-03T05:30:00Z",
            "2024-02-29T23:59:00Z",
        ];
        let strategy = (
            skiff_fuzz::mutated_text(&seeds, &[b"-", b"/", b"*", b"?", b"L", b"W", b"#", b"TZ=", b"0"], 5),
            prop::sample::select(zones),
            prop::sample::select(instants),
        );
        skiff_fuzz::run("fuzz_cron_schedules", 1500, strategy, |(schedule, zone, at)| {
            if skiff_api::validation::validate_cron_schedule(&schedule).is_err() {
                return Ok(());
            }
            let parsed = match Schedule::parse(&schedule, zone) {
                Ok(p) => p,
                // A `TZ=` prefix naming no zone is refused here, with the time zone's error.
                Err(e) if e.starts_with("unknown time zone") => return Ok(()),
                Err(e) => {
                    return Err(format!(
                        "the API accepts {schedule:?} but the controller refuses it: {e}"
                    ));
                }
            };
            let t = ts(at);
            let started = std::time::Instant::now();
            let next = parsed.next(t);
            if started.elapsed() > std::time::Duration::from_secs(1) {
                return Err(format!("next({at}) of {schedule:?} took {:?}", started.elapsed()));
            }
            if let Some(n) = next
                && n <= t
            {
                return Err(format!("next({at}) of {schedule:?} is {n}, not later"));
            }
            Ok(())
        });
    }
}
