-- Argo CD opens no string library unless argocd-cm sets useOpenLibs for the kind.
return {status = "Healthy", message = string.lower(obj.spec.text)}
