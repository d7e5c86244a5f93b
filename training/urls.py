"""The ML staff's pages: training home, item sets, jobs (progress, cancel, artifacts), rollouts, datasets, evaluations, rollback."""

from django.urls import path

from . import version_views, views
from .itemsets import views as itemset_views

app_name = "training"

urlpatterns = [
    path("", views.home, name="home"),
    path("jobs/start/", views.job_start, name="job-start"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/progress.json", views.job_progress, name="job-progress"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/artifacts/<str:name>", views.job_artifact, name="job-artifact"),
    path("rollouts/", views.rollouts_start, name="rollouts-start"),
    path("datasets/build/", views.dataset_build, name="dataset-build"),
    path("datasets/<int:dataset_id>/", views.dataset_detail, name="dataset"),
    path("datasets/<int:dataset_id>/files/<str:name>", views.dataset_file, name="dataset-file"),
    path("evaluations/<int:evaluation_id>/", views.evaluation_detail, name="evaluation"),
    path("itemsets/", itemset_views.itemset_list, name="itemsets"),
    path("itemsets/upload/", itemset_views.itemset_upload, name="itemset-upload"),
    path("itemsets/template.csv", itemset_views.itemset_template, name="itemset-template"),
    path("itemsets/add/", itemset_views.itemset_add_task, name="itemset-add-task"),
    path("itemsets/add-view/", itemset_views.itemset_add_view, name="itemset-add-view"),
    path("itemsets/<slug:name>/", itemset_views.itemset_detail, name="itemset"),
    path("itemsets/<slug:name>/items.jsonl", itemset_views.itemset_export, name="itemset-export"),
    path("itemsets/<slug:name>/manifest.json", itemset_views.itemset_manifest, name="itemset-manifest"),
    path("versions/rollback/", version_views.version_rollback, name="rollback"),
    path("versions/<int:version_id>/promote/", version_views.version_promote, name="promote"),
    path("versions/<int:version_id>/shadow/", version_views.version_shadow, name="shadow"),
    path("versions/<int:version_id>/evaluate/", version_views.version_evaluate, name="evaluate"),
]
